"""Hosts of a test's own on this machine: network namespaces joined by a bridge, for what a single host hides.

`NetworkHosts(["control", "node-1", "node-2"])` makes a namespace per host, each with loopback and one
address on a private /24 (`address(host)`), and a switch (a bridge in a namespace of its own) that joins
them and the test's own namespace (`test_address`). Hosts reach each other, and the test reaches them, only
by those addresses; nothing is routed anywhere else. `HostProcess` runs a command inside a host (`ip netns
exec`), in a process group of its own; `cut` and `heal` take a host off the switch and back (a network
partition). Leaving the block kills what still runs there and deletes every namespace and link it made,
however the test ends. Needs root (`ip netns`), as CI has. `broker_on`, `database_on` and `service` run
the embedded broker, PostgreSQL and Warmplane's services on a host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from pydantic_settings import BaseSettings

from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.embedded.processes import (
    kill_process_group,
    log_tail,
    start_process,
    stop_process_group,
)
from warmplane.shared.settings import KafkaSettings, settings_environment

_IP_TIMEOUT_S = 10.0


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def _subnets_in_use() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    done = subprocess.run(
        ["ip", "-4", "route"], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=True
    )
    found = set()
    for line in done.stdout.splitlines():
        with_prefix = line.split()[0]
        if "/" in with_prefix:
            found.add(ipaddress.ip_network(with_prefix, strict=False))
    return found


class NetworkHosts:
    def __init__(self, hosts: Sequence[str]) -> None:
        if len(hosts) > 200:
            raise ValueError("at most 200 hosts")
        self.hosts = list(hosts)
        self._run = f"{random.getrandbits(16):04x}"
        used = _subnets_in_use()
        candidates = (ipaddress.ip_network(f"10.77.{i}.0/24") for i in range(1, 255))
        free = [net for net in candidates if not any(net.overlaps(other) for other in used)]
        self._subnet = random.choice(free)
        self._made: list[str] = []
        self._root_link: str | None = None
        self._processes: list[HostProcess] = []

    def namespace(self, host: str) -> str:
        return f"wp{self._run}-{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        return str(self._subnet[10 + self.hosts.index(host)])

    @property
    def test_address(self) -> str:
        """The test's own address on the switch."""
        return str(self._subnet[254])

    @property
    def switch(self) -> str:
        return f"wp{self._run}-sw"

    def wrapper(self, host: str) -> list[str]:
        """The command prefix that runs a program inside `host`."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def __enter__(self) -> Self:
        try:
            self._create()
        except BaseException:
            self._delete()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._delete()

    def _create(self) -> None:
        prefix = self._subnet.prefixlen
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        _ip("link", "set", "br0", "up", netns=self.switch)
        for index, host in enumerate(self.hosts):
            namespace = self.namespace(host)
            inside, outside = f"wp{self._run}h{index}", f"wp{self._run}s{index}"
            _ip("netns", "add", namespace)
            self._made.append(namespace)
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "netns", self.switch)
            _ip("link", "set", outside, "master", "br0", "up", netns=self.switch)
            _ip("addr", "add", f"{self.address(host)}/{prefix}", "dev", inside, netns=namespace)
            _ip("link", "set", inside, "up", netns=namespace)
            _ip("link", "set", "lo", "up", netns=namespace)
        root, outside = f"wp{self._run}t", f"wp{self._run}ts"
        _ip("link", "add", root, "type", "veth", "peer", "name", outside)
        self._root_link = root
        _ip("link", "set", outside, "netns", self.switch)
        _ip("link", "set", outside, "master", "br0", "up", netns=self.switch)
        _ip("addr", "add", f"{self.test_address}/{prefix}", "dev", root)
        _ip("link", "set", root, "up")

    def cut(self, host: str) -> None:
        """Take `host` off the switch (its link down): a network partition, its processes running on."""
        index = self.hosts.index(host)
        _ip("link", "set", f"wp{self._run}h{index}", "down", netns=self.namespace(host))

    def heal(self, host: str) -> None:
        """Put `host` back on the switch."""
        index = self.hosts.index(host)
        _ip("link", "set", f"wp{self._run}h{index}", "up", netns=self.namespace(host))

    def start(
        self, host: str, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None
    ) -> HostProcess:
        """`argv` running inside `host`, logging to `log_path`; stopped with the hosts if not before."""
        process = HostProcess(start_process([*self.wrapper(host), *argv], log_path, env=env), log_path)
        self._processes.append(process)
        return process

    def _delete(self) -> None:
        for process in self._processes:
            process.kill()
        leftovers = [["link", "del", self._root_link]] if self._root_link is not None else []
        leftovers += [["netns", "del", namespace] for namespace in reversed(self._made)]
        for args in leftovers:
            subprocess.run(["ip", *args], capture_output=True, timeout=_IP_TIMEOUT_S, check=False)
        self._root_link = None
        self._made.clear()


class HostProcess:
    """A process a host runs, leader of its own process group."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout_s: float = 90.0) -> int:
        """SIGTERM, as Kubernetes stops a pod's container; its exit code, once it and its group ended."""
        stop_process_group(self.proc, timeout_s, sig=signal.SIGTERM, whole_group=False)
        return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the whole group, as a lost node takes it. Idempotent."""
        kill_process_group(self.proc)


@contextlib.contextmanager
def broker_on(hosts: NetworkHosts, host: str, workdir: Path) -> Iterator[KafkaSettings]:
    """The embedded broker on `host`; the settings every part reaches it with (fresh topics)."""
    broker = EmbeddedKafka(
        workdir / "kafka", host=hosts.address(host), port=9092, wrapper=hosts.wrapper(host)
    )
    kafka = KafkaSettings(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"mh{uuid.uuid4().hex[:8]}",
        partitions=2,
        session_timeout_ms=2_000,
        heartbeat_interval_ms=500,
        fetch_max_wait_ms=100,
    )
    with broker:
        yield kafka


@contextlib.asynccontextmanager
async def database_on(hosts: NetworkHosts, host: str, workdir: Path) -> AsyncIterator[str]:
    """PostgreSQL on `host`, migrated; its DSN."""
    postgres = EmbeddedPostgres(
        workdir / "postgres", host=hosts.address(host), port=5432, wrapper=hosts.wrapper(host)
    )
    with postgres:
        await asyncio.to_thread(migrate.upgrade, postgres.sqlalchemy_url)
        yield postgres.asyncpg_dsn


def service(
    hosts: NetworkHosts, host: str, command: str, settings: BaseSettings, workdir: Path
) -> HostProcess:
    """`warmplane <command>` on `host`, its settings given as the environment it reads in a pod."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
    env.update(settings_environment(settings))
    log = workdir / f"{command}-{host}-{uuid.uuid4().hex[:6]}.log"
    return hosts.start(host, [str(Path(sys.executable).with_name("warmplane")), command], log, env=env)


def print_logs(folder: Path) -> None:
    """The end of every part's log under `folder`, shown with a failure."""
    for log in sorted(folder.rglob("*.log")):
        print(f"--- {log.relative_to(folder)}\n{log_tail(log)}")
