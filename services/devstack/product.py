"""The parts of the development stack a team uses: the gateway and the API (status page, CLI), with the
credentials a newcomer would otherwise have to invent.

Both run in the job's process, on the same embedded broker and PostgreSQL as the planner and the warmer,
on loopback ports. The credentials are generated per run, unless a file pins them: an admin token for the
API, an API key and a cache-salt secret for the one tenant, and the key every part signs and checks control
events with. The token and the key are printed to the terminal of the person who ran the job (a development
stack: nobody else sees that terminal); no credential is ever logged.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import Annotated, Self, TextIO

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from warmplane.services.api.app import build_app
from warmplane.services.api.service import api_deps
from warmplane.services.api.settings import ApiCaller, ApiOptions, ApiSettings
from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings, RoutingSettings
from warmplane.shared.asgi_server import AsgiServer
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE
from warmplane.shared.settings import MIN_EVENT_KEY_CHARS, MIN_KEY_CHARS, KafkaSettings, PostgresSettings

HOST = "127.0.0.1"


class InvalidCredentials(ValueError):
    """A credentials file that cannot be read or does not validate; the text never holds a value."""


class Credentials(BaseModel):
    """The stack's secrets. `warmplane up --credentials FILE` pins any of them (a JSON object of these
    fields) so that scripts and bookmarks survive a restart; the others are generated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    admin_token: Annotated[SecretStr, Field(min_length=MIN_KEY_CHARS)] = Field(
        default_factory=lambda: SecretStr(f"wp-admin-{secrets.token_urlsafe(24)}")
    )
    """The API's one caller, an admin (the status page's and the CLI's token)."""
    api_key: Annotated[SecretStr, Field(min_length=MIN_KEY_CHARS)] = Field(
        default_factory=lambda: SecretStr(f"sk-wp-{secrets.token_urlsafe(24)}")
    )
    """The tenant's key at the gateway."""
    tenant_secret: Annotated[SecretStr, Field(min_length=MIN_KEY_CHARS)] = Field(
        default_factory=lambda: SecretStr(secrets.token_urlsafe(32))
    )
    """Derives the tenant's cache salt (the gateway's and the warmer's)."""
    event_key: Annotated[SecretStr, Field(min_length=MIN_EVENT_KEY_CHARS)] = Field(
        default_factory=lambda: SecretStr(secrets.token_urlsafe(32))
    )
    """Signs control events (lifecycle, epochs, plans); the planner, the warmer, the gateway and the API
    check them, as `WARMPLANE_EVENT_KEYS` makes them in production."""

    @classmethod
    def read(cls, path: Path) -> Credentials:
        """The credentials `path` pins; `InvalidCredentials` names what is wrong, never a value."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidCredentials(f"cannot read the credentials file {path}: {exc.strerror}") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'the file'}: {error['msg']}"
                for error in exc.errors(include_url=False, include_input=False, include_context=False)
            )
            raise InvalidCredentials(f"the credentials file {path}: {problems}") from None


class Product:
    """The gateway and the API, serving until the block ends."""

    def __init__(
        self,
        credentials: Credentials,
        tenant: str,
        kafka: KafkaSettings,
        postgres: PostgresSettings,
        routing: RoutingSettings,
    ) -> None:
        self.credentials = credentials
        event_keys = [credentials.event_key]
        self.gateway = Gateway(
            GatewaySettings(
                kafka=kafka,
                postgres=postgres,
                tenant_keys={tenant: [credentials.api_key]},
                tenant_secrets={tenant: credentials.tenant_secret},
                gateway=GatewayOptions(
                    http_host=HOST, http_port=0, metrics_host=HOST, metrics_port=0, block_size=BLOCK_SIZE
                ),
                routing=routing,
                event_keys=event_keys,
            )
        )
        self._api_settings = ApiSettings(
            kafka=kafka,
            postgres=postgres,
            api=ApiOptions(http_host=HOST, http_port=0),
            api_callers=[ApiCaller(name="warmplane-up", token=credentials.admin_token, role="admin")],
            event_keys=event_keys,
        )
        self._api: AsgiServer | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        try:
            await self._stack.enter_async_context(self.gateway)
            deps = await self._stack.enter_async_context(api_deps(self._api_settings))
            self._api = AsgiServer(build_app(deps), HOST, 0, name="api")
            await self._api.start()
            self._stack.push_async_callback(self._api.stop)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def gateway_url(self) -> str:
        return self.gateway.url

    @property
    def api_url(self) -> str:
        assert self._api is not None, "not started"
        return f"http://{HOST}:{self._api.port}"

    def show(self, model: str, out: TextIO) -> None:
        """What a newcomer pastes: a request through the gateway, the status page, the CLI's settings."""
        key = self.credentials.api_key.get_secret_value()
        token = self.credentials.admin_token.get_secret_value()
        out.write(
            f"the gateway (OpenAI API) at {self.gateway_url}:\n"
            f"  curl -s {self.gateway_url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
            f"-H 'Content-Type: application/json' \\\n"
            f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], '
            f'"max_tokens": 32}}\'\n'
            f"the status page: {self.api_url}/status#token={token}\n"
            f"the gateway's metrics (Prometheus): {self.gateway.metrics_url}/metrics\n"
            f"the CLI, in another terminal:\n"
            f"  export WARMPLANE_API_URL={self.api_url} WARMPLANE_CLI_TOKEN={token}\n"
            f"  warmplane replicas; warmplane warm-sets --model {model}; "
            f"warmplane scale --model {model} --to 3\n"
        )
