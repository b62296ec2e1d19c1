"""The parts of the development stack a team uses: the gateway and the API (status page, CLI), with the
credentials a newcomer would otherwise have to invent.

Both run in the job's process, on the same embedded broker and PostgreSQL as the planner and the warmer,
on loopback ports. The credentials are generated per run: an admin token for the API, an API key and a
cache-salt secret for the one tenant. They are printed to the terminal of the person who ran the job (a
development stack: nobody else sees that terminal), never logged.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Self, TextIO

from pydantic import SecretStr

from warmplane.services.api.app import build_app
from warmplane.services.api.service import api_deps
from warmplane.services.api.settings import ApiOptions, ApiSettings, ApiToken
from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings, RoutingSettings
from warmplane.shared.asgi_server import AsgiServer
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE
from warmplane.shared.settings import KafkaSettings, PostgresSettings

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Credentials:
    tenant: str
    admin_token: SecretStr = field(default_factory=lambda: SecretStr(f"wp-admin-{secrets.token_urlsafe(24)}"))
    api_key: SecretStr = field(default_factory=lambda: SecretStr(f"sk-wp-{secrets.token_urlsafe(24)}"))
    tenant_secret: SecretStr = field(default_factory=lambda: SecretStr(secrets.token_urlsafe(32)))


class Product:
    """The gateway and the API, serving until the block ends."""

    def __init__(
        self,
        credentials: Credentials,
        kafka: KafkaSettings,
        postgres: PostgresSettings,
        routing: RoutingSettings,
    ) -> None:
        self.credentials = credentials
        tenant = credentials.tenant
        self.gateway = Gateway(
            GatewaySettings(
                kafka=kafka,
                postgres=postgres,
                api_keys={tenant: [credentials.api_key]},
                tenant_secrets={tenant: credentials.tenant_secret},
                gateway=GatewayOptions(
                    http_host=HOST, http_port=0, metrics_host=HOST, metrics_port=0, block_size=BLOCK_SIZE
                ),
                routing=routing,
            )
        )
        self._api_settings = ApiSettings(
            kafka=kafka,
            postgres=postgres,
            api=ApiOptions(http_host=HOST, http_port=0),
            api_tokens=[ApiToken(name="warmplane-up", token=credentials.admin_token, role="admin")],
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
            f"the CLI, in another terminal:\n"
            f"  export WARMPLANE_API_URL={self.api_url} WARMPLANE_API_TOKEN={token}\n"
            f"  warmplane replicas; warmplane warm-sets --model {model}; "
            f"warmplane scale --model {model} --to 3\n"
        )
