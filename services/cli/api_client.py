"""The CLI's side of the API: where it is, who calls, and one error type for every refusal.

Settings come from the environment: `WARMPLANE_API_URL` (default http://127.0.0.1:8070) and
`WARMPLANE_CLI_TOKEN` (a secret: never printed, never taken from the command line where `ps` and shell
history would keep it).
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiClientSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WARMPLANE_", extra="ignore")

    api_url: str = Field("http://127.0.0.1:8070", pattern=r"^https?://[^\s]+$")
    """The API the CLI's commands talk to."""
    cli_token: SecretStr = SecretStr("")
    """A bearer token of the API (`WARMPLANE_API_CALLERS` lists them); a secret."""
    api_timeout_s: float = Field(10.0, gt=0)
    """Longest wait for one API answer."""


class ApiError(Exception):
    """The API refused or could not be reached; `str()` is the line to show the user."""


class ApiClient:
    def __init__(self, settings: ApiClientSettings, transport: httpx.BaseTransport | None = None) -> None:
        token = settings.cli_token.get_secret_value()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=settings.api_url, headers=headers, timeout=settings.api_timeout_s, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params=_present(params))

    def post(self, path: str, body: object, **params: Any) -> Any:
        return self._call("POST", path, params=_present(params), json=body)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the API at {self._http.base_url}: {exc}") from None
        if response.is_success:
            return response.json()
        try:
            message = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        hint = " (set WARMPLANE_CLI_TOKEN)" if response.status_code == 401 else ""
        raise ApiError(f"{method} {path}: {response.status_code} {message}{hint}")


def _present(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if value is not None}
