"""The project's Worker in a test: `scripts/dev` (`wrangler dev` on real workerd) on a
free port, killed and restarted at will.

    worker = DevWorker(project, tmp_path / "state", settings={"PAYMENTS_API_URL": url},
                       agent="examples/refunds/agent.py").start()
    pending = worker.start_post("/sessions/r1/messages", {"message": "refund order 7"})
    worker.kill()                      # SIGKILL: a crash, nothing cleans up
    worker.restart()                   # the same D1 state, settings and agent
    worker.post("/sessions/r1/resume")
    worker.count("SELECT * FROM agent_messages WHERE role = 'tool'")
    with worker.stream("POST", "/sessions/r2/messages", {"message": "hi"}) as events:
        for event in events:           # SSE, each event as it arrives (EventStream)
            ...                        # leaving the block early is a client disconnect
    worker.close()                     # every process it started, gone

In pytest, the `dev_worker` fixture of `durable_agents.testing.pytest_plugin`
makes them and closes them after the test.

What the server gets: the project's wrangler.toml `[vars]`, then `settings`
(written to a `.dev.vars` file of its own; the project's `.dev.vars` is not
read), and `API_TOKEN` = `token` unless `settings` has one. Its environment
holds only what a process needs (PATH, HOME, locale, temp, Node's and
npm's variables), `PYODIDE_BUNDLE` (which Pyodide bundle workerd runs) and
`env`, so a setting exported in the developer's shell never reaches a test.
D1 lives in the state directory, where wrangler keeps it (`<state>/v3/d1/`):
`rows()` and `count()` read its SQLite file (read-only, a query in
milliseconds) while the server runs or after it died.
`wrangler()` is the project's own wrangler (`scripts/wrangler`: on the
pinned Node 22 of runtime/node, with runtime/workerd), as the dev server
runs it.

`scripts/dev` runs in a process group of its own, with wrangler and its
workerd processes: `kill()` SIGKILLs the whole group (the Worker dies
mid-request, as in a crash) and returns once no process of it runs;
`close()` does the same for every server started, so no workerd outlives
the test.

No pytest import: usable from scripts too. The guide, with a kill -9 test:
docs/testing.md ("The Worker over HTTP: `dev_worker`").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json as jsonlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DevWorker",
    "EventStream",
    "SSEEvent",
    "WorkerResponse",
    "find_project",
    "kill_group",
    "run_wrangler",
    "running_in_group",
]

START_TIMEOUT_S = float(os.environ.get("DURABLE_AGENTS_DEV_START_TIMEOUT", "120"))
# How long the processes of a killed or stopped server may take to be gone.
GONE_TIMEOUT_S = 20.0
# The project's wrangler on its pinned Node 22 (wrangler needs Node >= 22.12), with
# runtime/workerd as its workerd: what the dev server (runtime/dev.py) runs too.
WRANGLER = Path("scripts", "wrangler")
# What a process needs from the environment, which Pyodide bundle workerd runs
# (runtime/dev.py: PYODIDE_BUNDLE; scripts/test sets it) and the [vars] that replace the
# config's (DURABLE_AGENTS_VARS: the kit's own tests serve the template's); nothing else
# reaches the server.
_KEPT_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "TZ", "TMPDIR", "TEMP", "TMP"}
    | {"PYODIDE_BUNDLE", "DURABLE_AGENTS_VARS"}
)
_KEPT_ENV_PREFIXES = ("LC_", "NODE_", "NPM_", "npm_", "XDG_")


def find_project(start: Path | None = None) -> Path:
    """The project root: the nearest directory above `start` (default: the current one)
    holding wrangler.toml and scripts/dev."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / "wrangler.toml").is_file() and (directory / "scripts" / "dev").is_file():
            return directory
    raise FileNotFoundError(f"no project (wrangler.toml and scripts/dev) above {here}")


@dataclass(frozen=True, slots=True)
class WorkerResponse:
    """One answer of the Worker: `body` is the parsed JSON (None if the body is not JSON)."""

    status: int
    headers: Mapping[str, str]
    text: str
    body: Any = None


@dataclass
class DevWorker:
    """`scripts/dev` serving the project's Worker, with its own state directory.

    `agent`: an agent module file to serve instead of src/agent.py (`--agent`),
    absolute or relative to the project. `agents`: a folder of agent modules to serve
    instead of src/agents/'s (`--agents`), each at /agents/<its file's name>/sessions/...
    `settings`: added to wrangler.toml's `[vars]`. `token`: the `API_TOKEN`, sent as
    `Authorization: Bearer` by `post`/`get`/`request` unless they are given `token=`. `env`: extra
    environment variables for the server process. `port`: the port to serve on
    (`--port`; 0, the default: any free one, which `url` says once it is ready).
    `migrated_d1`: a state directory without D1 yet starts from a copy of the project's
    D1 with every migration applied (made once per set of migrations, in
    `.cache/dev-d1/`, by `scripts/dev --migrate-only`), so the start runs no migration
    (about 6 s saved); False: the server migrates it itself, as on a fresh clone.
    """

    project: Path
    state_dir: Path
    settings: Mapping[str, str] = field(default_factory=dict)
    agent: str | Path | None = None
    agents: str | Path | None = None
    token: str = "test-token"
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout: float = START_TIMEOUT_S
    port: int = 0
    migrated_d1: bool = True
    url: str = field(default="", init=False)
    lines: list[str] = field(default_factory=list, init=False)
    start_s: float = field(default=0.0, init=False)
    process: subprocess.Popen[str] | None = field(default=None, init=False)
    _started: list[tuple[subprocess.Popen[str], threading.Thread]] = field(
        default_factory=list, init=False
    )

    # -- the server process -------------------------------------------------------

    def start(self) -> DevWorker:
        """Start the server and wait until it is ready; returns self."""
        if self.running:
            raise RuntimeError(f"the dev server is already running on {self.url}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        d1 = self.state_dir / "v3" / "d1"
        if self.migrated_d1 and not d1.exists():
            shutil.copytree(migrated_d1(self.project, self.env), d1)
        dev_vars = self.state_dir / "dev-worker.dev.vars"
        dev_vars.write_text(self.dev_vars_text())
        command = [
            str(self.project / "scripts" / "dev"), "--port", str(self.port),
            "--persist-to", str(self.state_dir), "--dev-vars", str(dev_vars),
        ]  # fmt: skip
        if self.agent is not None:
            command += ["--agent", str(self.project / self.agent)]
        if self.agents is not None:
            command += ["--agents", str(self.project / self.agents)]
        self.url = ""
        started = time.perf_counter()
        self.process = subprocess.Popen(
            command,
            cwd=self.project,
            env=_child_env(self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: close() kills workerd with it
        )
        ready = threading.Event()
        reader = threading.Thread(target=self._read, args=(self.process, ready), daemon=True)
        reader.start()
        self._started.append((self.process, reader))
        if not ready.wait(self.start_timeout) or not self.url:
            why = f"did not start within {self.start_timeout:.0f} s"
            if ready.is_set():  # its output ended: let it exit with its own status
                with contextlib.suppress(subprocess.TimeoutExpired):
                    why = f"exited ({self.process.wait(10)}) before it was ready"
            self.close()
            raise RuntimeError(f"the dev server {why}:\n" + "\n".join(self.lines[-40:]))
        self.start_s = time.perf_counter() - started
        return self

    def dev_vars_text(self) -> str:
        """What the server's own .dev.vars file holds: `API_TOKEN` and `settings`, as
        dotenv lines. (Override it to test how the server reads such a file.)"""
        settings = {"API_TOKEN": self.token, **self.settings}
        return "".join(f"{k}={_dotenv_value(v)}\n" for k, v in settings.items())

    def _read(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))
            match = re.match(r"dev: ready on (http://\S+)$", line)
            if match and process is self.process:
                self.url = match.group(1)
                ready.set()
        ready.set()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the server: its process group, so wrangler and workerd die at once (a
        crash: the Worker dies mid-request, no cleanup runs). Returns once none of its
        processes runs any more."""
        if self.process is not None:
            kill_group(self.process)

    def stop(self) -> None:
        """End the server cleanly (SIGTERM), as Ctrl-C would; returns once none of its
        processes runs (SIGKILL for any left after a while)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        if not _group_gone(process.pid, timeout=GONE_TIMEOUT_S):
            kill_group(process)
        process.wait()

    def restart(self) -> DevWorker:
        """Start the server again on the same state (stopping it first if it runs). The
        port may change: `url` is the new one."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and kill every process any of its starts left behind."""
        self.stop()
        for process, reader in self._started:
            kill_group(process)
            reader.join(10)
            if process.stdout is not None:
                process.stdout.close()
        self._started.clear()

    def __enter__(self) -> DevWorker:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for_line(self, pattern: str, timeout: float = 10) -> str:
        """The first output line matching `pattern` (a regex), waiting for it to be printed."""
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if re.search(pattern, line):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"no line matches {pattern!r}:\n" + "\n".join(self.lines))
            time.sleep(0.02)

    # -- HTTP ---------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        timeout: float = 60,
    ) -> WorkerResponse:
        """One request to the Worker. `token=None` sends the worker's token; `""` none."""
        if not self.url:
            raise RuntimeError("the dev server is not running: start() it first")
        token = self.token if token is None else token
        all_headers = {"authorization": f"Bearer {token}"} if token else {}
        all_headers.update(headers or {})
        request = urllib.request.Request(
            self.url + path, data=body, method=method, headers=all_headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return _response(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as error:
            with error:
                return _response(error.code, dict(error.headers), error.read())

    def post(self, path: str, json: Any = None, **kwargs: Any) -> WorkerResponse:
        """POST `json` as a JSON body (no body when None); `request`'s keywords."""
        data = None if json is None else jsonlib.dumps(json).encode()
        headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
        return self.request("POST", path, data, headers=headers, **kwargs)

    def start_post(self, path: str, json: Any = None, **kwargs: Any) -> Future[WorkerResponse]:
        """`post` in a background thread: for a request the test kills the server under.
        Its `result()` is the answer, or raises if the server died before answering."""
        future: Future[WorkerResponse] = Future()

        def send() -> None:
            try:
                future.set_result(self.post(path, json, **kwargs))
            except BaseException as exc:  # handed to the test through the future
                future.set_exception(exc)

        threading.Thread(target=send, daemon=True).start()
        return future

    def get(self, path: str, **kwargs: Any) -> WorkerResponse:
        """GET `path`; `request`'s keywords."""
        return self.request("GET", path, **kwargs)

    def stream(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        timeout: float = 60,
    ) -> EventStream:
        """A request asking for server-sent events (`Accept: text/event-stream`), opened
        at once: its `status`, `headers`, and its events as they arrive. Close it (or
        leave its `with` block) to disconnect."""
        if not self.url:
            raise RuntimeError("the dev server is not running: start() it first")
        token = self.token if token is None else token
        all_headers = {"accept": "text/event-stream"}
        if token:
            all_headers["authorization"] = f"Bearer {token}"
        body = None if json is None else jsonlib.dumps(json).encode()
        if body is not None:
            all_headers["content-type"] = "application/json"
        all_headers.update(headers or {})
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
        connection.request(method, path, body=body, headers=all_headers)
        return EventStream(connection, connection.getresponse())

    # -- D1 -------------------------------------------------------------------------

    def rows(self, sql: str) -> list[dict[str, Any]]:
        """The rows of one SQL statement on the Worker's local D1 database, while the
        server runs or after it died: read-only from the database's SQLite file, where
        miniflare keeps it under the state directory (`<state>/v3/d1/`; a query takes
        milliseconds). Where that folder holds several databases, or a statement writes,
        use `wrangler("d1", "execute", ...)`, which runs wrangler (about 2 s each)."""
        path = self._d1_file()
        if path is None:
            return self._wrangler_rows(sql)
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            connection.row_factory = sqlite3.Row
            return [dict(row) for row in connection.execute(sql)]
        finally:
            connection.close()

    def _d1_file(self) -> Path | None:
        """The SQLite file of the state's one D1 database; None if there is not exactly one."""
        folder = self.state_dir / "v3" / "d1" / "miniflare-D1DatabaseObject"
        files = [f for f in folder.glob("*.sqlite") if f.name != "metadata.sqlite"]
        return files[0] if len(files) == 1 else None

    def _wrangler_rows(self, sql: str) -> list[dict[str, Any]]:
        out = self.wrangler(
            "d1", "execute", self.database, "--local", "--json", "--command", sql,
            "--persist-to", str(self.state_dir),
        )  # fmt: skip
        rows: list[dict[str, Any]] = jsonlib.loads(out)[0]["results"]
        return rows

    def count(self, sql: str) -> int:
        """How many rows the query `sql` returns."""
        return int(self.rows(f"SELECT COUNT(*) AS n FROM ({sql})")[0]["n"])

    @property
    def database(self) -> str:
        """The name of the first D1 database of wrangler.toml."""
        config = tomllib.loads((self.project / "wrangler.toml").read_text())
        databases = config.get("d1_databases") or [{}]
        return str(databases[0].get("database_name") or databases[0].get("binding") or "DB")

    def wrangler(self, *args: str, timeout: float = 120) -> str:
        """`wrangler ARGS` in the project, as the dev server runs it: `scripts/wrangler`
        (the project's wrangler on its pinned Node 22, runtime/workerd as its workerd),
        offline and non-interactive; its stdout."""
        env = {**_child_env(self.env), "CI": "true", "NO_COLOR": "1"}
        env.setdefault("WRANGLER_SEND_METRICS", "false")
        return run_wrangler(self.project, args, env=env, timeout=timeout)


def run_wrangler(
    project: Path, args: Sequence[str], *, env: Mapping[str, str], timeout: float = 120
) -> str:
    """`scripts/wrangler ARGS` in `project` (its wrangler on its pinned Node, runtime/workerd
    as its workerd), with `env` and no input; its stdout. Raises RuntimeError with its
    output if it fails."""
    script = project / WRANGLER
    if not script.is_file():
        raise RuntimeError(f"no {script}: the project's wrangler runs from there")
    done = subprocess.run(
        [str(script), *args],
        cwd=project,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"wrangler {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL the process group `process` leads, and wait until none of it runs."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    if not _group_gone(process.pid, timeout=GONE_TIMEOUT_S):
        raise RuntimeError(f"processes of group {process.pid} still run after SIGKILL")


def _group_gone(group: int, timeout: float) -> bool:
    """Whether, within `timeout` seconds, no process of group `group` runs (a zombie
    waiting to be reaped is not running: it holds no port and no file)."""
    deadline = time.monotonic() + timeout
    while True:
        if not running_in_group(group):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def running_in_group(group: int) -> list[int]:
    """The running processes of the process group `group` (a zombie, dead but not yet
    reaped, holds no port and no file: it does not count)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the group exists while any member does
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [group]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def migrated_d1(project: Path, env: Mapping[str, str] | None = None) -> Path:
    """The `v3/d1` folder of a dev server state whose D1 databases have every migration of
    the project applied: made once per wrangler.toml and migrations (`scripts/dev
    --migrate-only`, under a lock: test processes may ask at once), then reused."""
    digest = hashlib.sha256((project / "wrangler.toml").read_bytes())
    databases = tomllib.loads((project / "wrangler.toml").read_text()).get("d1_databases", [])
    folders = [project / str(db.get("migrations_dir") or "migrations") for db in databases]
    for migration in sorted(f for folder in folders for f in folder.glob("*.sql")):
        digest.update(migration.name.encode() + b"\0" + migration.read_bytes())
    root = project / ".cache" / "dev-d1"
    root.mkdir(parents=True, exist_ok=True)
    made = root / digest.hexdigest()[:16]
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made / "v3" / "d1").is_dir():
            scratch = root / f"{made.name}.new"
            shutil.rmtree(scratch, ignore_errors=True)
            done = subprocess.run(
                [str(project / "scripts" / "dev"), "--migrate-only", "--persist-to", str(scratch)],
                cwd=project, env=_child_env(env or {}), capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(
                    f"scripts/dev --migrate-only failed ({done.returncode}):\n"
                    f"{done.stdout}{done.stderr}"
                )
            (scratch / "v3" / "d1").mkdir(parents=True, exist_ok=True)  # (a config without D1)
            shutil.rmtree(made, ignore_errors=True)
            scratch.rename(made)
    return made / "v3" / "d1"


def _child_env(extra: Mapping[str, str]) -> dict[str, str]:
    kept = {
        k: v for k, v in os.environ.items() if k in _KEPT_ENV or k.startswith(_KEPT_ENV_PREFIXES)
    }
    # No .pyc files under src/: `wrangler dev` watches src/ ([build] watch_dir) and
    # rebuilds and reloads every running Worker when a file there changes.
    return {**kept, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def _dotenv_value(value: str) -> str:
    """A value as the dev server's .dev.vars reader reads it back (double quotes, \\n)."""
    if "\n" in value or "\r" in value:
        raise ValueError("a setting cannot hold a line break in a .dev.vars file")
    return f'"{value}"'


def _response(status: int, headers: Mapping[str, str], data: bytes) -> WorkerResponse:
    text = data.decode(errors="replace")
    try:
        body = jsonlib.loads(text) if text else None
    except ValueError:
        body = None
    return WorkerResponse(status, {k.lower(): v for k, v in headers.items()}, text, body)


@dataclass(frozen=True)
class SSEEvent:
    """One server-sent event: its name, its `id` (None without one), its data (JSON,
    parsed), and when it arrived (`time.monotonic()`)."""

    event: str
    id: str | None
    data: Any
    at: float


class EventStream:
    """An open SSE response (see `DevWorker.stream`); iterate it for `SSEEvent`s."""

    def __init__(
        self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse
    ) -> None:
        self.connection = connection
        self.response = response
        self.status = response.status
        self.headers = {k.lower(): v for k, v in response.getheaders()}
        self.events: list[SSEEvent] = []  # every event read so far

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect (mid-stream, this is a client going away)."""
        with contextlib.suppress(OSError):
            sock = self.connection.sock
            if sock is not None:
                sock.shutdown(2)
        self.connection.close()

    def json(self) -> Any:
        """The body of an answer that is not a stream (an error's JSON)."""
        return jsonlib.loads(self.response.read() or b"null")

    def __iter__(self) -> Iterator[SSEEvent]:
        name, event_id, data = "message", None, []
        while True:
            raw = self.response.readline()
            if not raw:
                return
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                continue
            if line:
                field_name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if field_name == "event":
                    name = value
                elif field_name == "id":
                    event_id = value
                elif field_name == "data":
                    data.append(value)
                continue
            if data:
                event = SSEEvent(name, event_id, jsonlib.loads("\n".join(data)), time.monotonic())
                self.events.append(event)
                yield event
            name, event_id, data = "message", None, []
