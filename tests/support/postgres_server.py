"""A private PostgreSQL server for the tests and scripts/bench_postgres.py: Debian's
`postgresql` package, initdb'd into a folder of its own (under the project's .cache/, or
the system's temporary folder as root: see `_base`), listening on a Unix socket only (in
that folder), stopped and removed at the end.

scripts/test installs the package where it is missing. Where it could not, it says why
in DURABLE_AGENTS_NO_POSTGRES and the PostgreSQL tests skip with that reason, and only
then: a missing server anywhere else fails them.

PostgreSQL refuses to run as root: as root, the server runs as `nobody`, which owns the
folder. Each pytest-xdist worker starts its own server (its own folder and socket), so
two never share one; each test gets a schema of its own (`fresh_dsn`), which is cheaper
than a database.

    from tests.support.postgres_server import postgres_fixture  # noqa: F401 - fixture
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

SKIP_REASON_VARIABLE = "DURABLE_AGENTS_NO_POSTGRES"
_ROOT = Path(__file__).resolve().parent.parent.parent
_SUPERUSER = "postgres"


def postgres_bin() -> Path:
    """The folder of Debian's server binaries (initdb, pg_ctl, postgres), newest version."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise FileNotFoundError(
        "Debian's PostgreSQL server is not installed: scripts/test installs it "
        "(apt-get install postgresql), or install it by hand"
    )


def _base() -> Path:
    """Where a server's folder goes: the project's .cache/; as root, the system's
    temporary folder, since the server runs as `nobody`, who may not be let into the
    project (a clone inside a 0700 folder, such as `mktemp -d` makes)."""
    if os.getuid() == 0:
        return Path(tempfile.gettempdir())
    cache = _ROOT / ".cache"
    cache.mkdir(exist_ok=True)
    return cache


def _server_user() -> list[str]:
    """The prefix running a server command: as `nobody` when we are root (PostgreSQL
    refuses to run as root)."""
    return ["runuser", "-u", "nobody", "--"] if os.getuid() == 0 else []


def _version(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


class LocalPostgres:
    """One server in a fresh folder (`_base`): `start()`, `dsn(...)`, `stop()`.

    `durable`: fsync and synchronous_commit on (what a benchmark measures); off for the
    tests, whose crashes are of the client processes, never of the server or the disk.
    """

    def __init__(self, *, durable: bool = False, tag: str = "") -> None:
        base = _base()
        _stop_orphans(base)
        self.folder = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{tag}", dir=base))
        self.data = self.folder / "data"
        self.socket_dir = self.folder  # a short path: a socket's path is at most 107 bytes
        self.port = 5432  # names the socket file only: no TCP listener
        self._durable = durable
        self._bin = postgres_bin()
        self._as_user = _server_user()

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self._as_user, *args], capture_output=True, text=True, check=False, cwd=self.folder
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}")

    def start(self) -> LocalPostgres:
        (self.folder / _OWNER).write_text(str(os.getpid()))
        if self._as_user:
            os.chown(self.folder, 65534, 65534)  # nobody
        self._run(
            str(self._bin / "initdb"), "-D", str(self.data), "-U", _SUPERUSER,
            "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        switch = "on" if self._durable else "off"
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}' "
            f"-c port={self.port} -c fsync={switch} -c synchronous_commit={switch} "
            f"-c full_page_writes={switch} -c max_connections=200 -c shared_buffers=64MB"
        )
        self._run(
            str(self._bin / "pg_ctl"), "start", "-D", str(self.data), "-w", "-t", "60",
            "-l", str(self.folder / "server.log"), "-o", options,
        )  # fmt: skip
        return self

    def dsn(self, database: str = _SUPERUSER, *, schema: str | None = None) -> str:
        """A `postgresql://` URL to `database` over the socket, in `schema` if given."""
        url = (
            f"postgresql://{_SUPERUSER}@/{database}?host={quote(str(self.socket_dir), safe='')}"
            f"&port={self.port}"
        )
        if schema is not None:
            url += "&options=" + quote(f"-c search_path={schema}", safe="")
        return url

    def create_schema(self, name: str) -> str:
        """A new empty schema `name`; the DSN of a store in it."""
        import psycopg  # the `postgres` extra: only where a server runs

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return self.dsn(schema=name)

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._run(str(self._bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate")
        shutil.rmtree(self.folder, ignore_errors=True)


_OWNER = "owner.pid"  # the process that started the server, which stops it
_PREFIX = "durable-agents-postgres-"  # a server's folder


def _stop_orphans(cache: Path) -> None:
    """Stop and remove the servers under `cache` whose owner died without stopping them
    (a test run killed): a shared machine should not keep them running."""
    for owner in cache.glob(f"{_PREFIX}*/{_OWNER}"):
        try:
            os.kill(int(owner.read_text()), 0)
        except ProcessLookupError:
            pass  # gone: its server is an orphan
        except (ValueError, OSError):
            continue  # unreadable, or alive under another user
        else:
            continue  # alive
        folder = owner.parent
        stop = [str(postgres_bin() / "pg_ctl"), "stop", "-D", str(folder / "data")]
        stop += ["-m", "immediate"]
        subprocess.run([*_server_user(), *stop], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def skip_reason() -> str | None:
    """Why scripts/test could not install the server, if it could not."""
    return os.environ.get(SKIP_REASON_VARIABLE) or None


class Server:
    """The session's server, as the tests use it: a fresh schema per call."""

    def __init__(self, server: LocalPostgres) -> None:
        self.server = server
        self._count = 0

    def fresh_dsn(self) -> str:
        """The DSN of a store in a new, empty schema of its own."""
        self._count += 1
        return self.server.create_schema(f"t{self._count}")


@pytest.fixture(scope="session", name="postgres")
def postgres_fixture(worker_id: str) -> Iterator[Server]:
    """This xdist worker's own PostgreSQL server, for the whole session."""
    reason = skip_reason()
    if reason:
        pytest.skip(f"PostgreSQL cannot be installed on this machine: {reason}")
    server = LocalPostgres(tag=f"{worker_id}-").start()
    try:
        yield Server(server)
    finally:
        server.stop()
