"""Run test functions inside the local Workers runtime (Pyodide + real D1) from pytest.

Each test file in a directory whose `conftest.py` does

    from durable_agents.testing.pytest_plugin import *  # noqa: F403

(this repo: `tests/runtime/`) runs INSIDE Pyodide, not in CPython, yet
every test in it is a normal pytest item: selected with `-k`, reported
pass/fail by name, with the Pyodide traceback (and the failing frame's
locals, as there is no assertion rewriting there) on failure.

How: pytest reads such a file with `ast` instead of importing it (it may
import `js`, `workers`, or the vendored packages), and makes one item per
top-level `test_*` function. Running an item sends the function's name to a
Node process running `runtime/test-server.mjs`, started once per pytest
session (fixture `workers_runtime`) and stopped at its end; D1 is emptied
before each test. A test's parameters are pytest fixtures resolved here on
CPython (their values must be JSON) except `env`, the Worker env inside the
runtime. Plain or `async def` functions; no marks or parametrize decorators
(parametrize a CPython fixture instead, as tests/runtime/conftest.py does).

Needs `npm ci` and `python3 scripts/vendor.py` (both: `scripts/setup-runtime`).

Also here, for ordinary CPython tests of the Worker over HTTP, the fixture
`dev_worker`: a factory starting the project's Worker with `scripts/dev` on
a free port (`durable_agents.testing.worker.DevWorker`: `post`, `get`,
`kill()` (SIGKILL), `restart()` on the same D1 state, `rows(sql)` and
`count(sql)` through `wrangler d1 execute`). Take it into a conftest.py:

    from durable_agents.testing.pytest_plugin import dev_worker  # noqa: F401
"""

from __future__ import annotations

import ast
import contextlib
import http.client
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import types
import urllib.parse
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from .worker import DevWorker, find_project

__all__ = [
    "WorkersRuntime",
    "dev_worker",
    "pytest_pycollect_makemodule",
    "pytest_runtest_makereport",
    "pytest_terminal_summary",
    "workers_runtime",
]

RUNTIME_PARAMETERS = frozenset({"env"})
START_TIMEOUT_S = float(os.environ.get("DURABLE_AGENTS_RUNTIME_START_TIMEOUT", "120"))
TEST_TIMEOUT_S = float(os.environ.get("DURABLE_AGENTS_RUNTIME_TEST_TIMEOUT", "600"))


def find_project_dir(start: Path) -> Path:
    """The repo root: the nearest directory above `start` holding runtime/test-server.mjs."""
    for directory in (start, *start.parents):
        if (directory / "runtime" / "test-server.mjs").is_file():
            return directory
    raise FileNotFoundError(f"no runtime/test-server.mjs above {start}")


class RuntimeTestFailure(AssertionError):
    """A test failed inside the runtime; its text is the Pyodide traceback."""


class WorkersRuntime:
    """A running `node runtime/test-server.mjs` and a client for it."""

    def __init__(self, project_dir: Path) -> None:
        self.project_dir = project_dir
        self.timings: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = project_dir / ".cache" / "runtime-test-server.log"
        self._log: IO[bytes] | None = None
        self._address: tuple[str, int] = ("127.0.0.1", 0)

    def start(self) -> None:
        node = shutil.which("node")
        missing = [
            p
            for p in ("node_modules/pyodide", "node_modules/miniflare", "python_modules/workers")
            if not (self.project_dir / p).exists()
        ]
        if node is None or missing:
            raise RuntimeError(
                f"the local Workers runtime is not set up (missing: {missing or ['node']}); "
                "run scripts/setup-runtime"
            )
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self._log_path.open("wb")
        self._process = subprocess.Popen(
            [node, str(self.project_dir / "runtime" / "test-server.mjs")],
            cwd=self.project_dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        ready = self._read_ready_line()
        url = urllib.parse.urlsplit(ready["url"])
        self._address = (url.hostname or "127.0.0.1", int(url.port or 0))
        self.timings = ready["timings"]

    def _read_ready_line(self) -> dict[str, Any]:
        assert self._process is not None
        assert self._process.stdout is not None
        stdout = self._process.stdout
        box: list[bytes] = []
        reader = threading.Thread(target=lambda: box.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not box or not box[0]:
            self.stop()
            log = self._log_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(
                f"the Workers runtime did not start within {START_TIMEOUT_S:.0f} s; its log "
                f"({self._log_path}):\n{log}"
            )
        ready: dict[str, Any] = json.loads(box[0])
        return ready

    def run_test(
        self, file: str, function: str, kwargs: dict[str, Any], *, reset_d1: bool = True
    ) -> dict[str, Any]:
        """Run one in-runtime test; the outcome as the runtime reports it."""
        try:
            kwargs_json = json.dumps(kwargs)
        except TypeError as exc:
            raise TypeError(
                f"fixture values passed into the runtime must be JSON: {exc}; "
                f"got {sorted(kwargs)} for {function}"
            ) from exc
        body = json.dumps(
            {"file": file, "function": function, "kwargs_json": kwargs_json, "reset_d1": reset_d1}
        )
        connection = http.client.HTTPConnection(*self._address, timeout=TEST_TIMEOUT_S)
        try:
            connection.request("POST", "/run", body, {"content-type": "application/json"})
            response = connection.getresponse()
            payload = response.read().decode()
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"the Workers runtime failed to run {function}: {payload}")
        outcome: dict[str, Any] = json.loads(payload)
        return outcome

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


_started: list[WorkersRuntime] = []


@pytest.fixture(scope="session")
def workers_runtime(request: pytest.FixtureRequest) -> Iterator[WorkersRuntime]:
    """The local Workers runtime, started once per session on first use, stopped at its end."""
    runtime = WorkersRuntime(find_project_dir(Path(str(request.config.rootpath))))
    _started.append(runtime)
    try:
        runtime.start()  # inside the try: a bad start still stops the Node process
        yield runtime
    finally:
        runtime.stop()


@pytest.fixture
def dev_worker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., DevWorker]]:
    """Start the project's Worker (`scripts/dev`) on a free port, each with its own D1 state.

        worker = dev_worker(settings={"PAYMENTS_API_URL": url}, agent="examples/refunds/agent.py")

    Keywords (all optional): `settings` (added to wrangler.toml's `[vars]`),
    `agent` (an agent module file to serve instead of src/agent.py), `token`
    (the `API_TOKEN`, default "test-token"), `env` (environment variables).
    Returns the started `DevWorker`; every server started is closed (its
    process group killed) when the test ends.
    """
    project = find_project(Path(str(request.config.rootpath)))
    started: list[DevWorker] = []

    def start(
        *,
        settings: dict[str, str] | None = None,
        agent: str | Path | None = None,
        token: str = "test-token",
        env: dict[str, str] | None = None,
    ) -> DevWorker:
        worker = DevWorker(
            project,
            tmp_path / f"dev-worker-{len(started) + 1}",
            settings=settings or {},
            agent=agent,
            token=token,
            env=env or {},
        )
        started.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        for worker in started:
            worker.close()


def _runtime_test_stub(
    path: Path, project_dir: Path, node: ast.FunctionDef | ast.AsyncFunctionDef
) -> Callable[..., None]:
    """A CPython function standing for one in-runtime test: pytest calls it with fixtures."""
    relative = path.relative_to(project_dir).as_posix()
    arguments = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    fixtures = [name for name in arguments if name not in RUNTIME_PARAMETERS]
    name = node.name

    def stub(**kwargs: Any) -> None:
        __tracebackhide__ = True
        runtime: WorkersRuntime = kwargs.pop("workers_runtime")
        outcome = runtime.run_test(relative, name, kwargs)
        sys.stdout.write(outcome.get("stdout", ""))
        sys.stderr.write(outcome.get("stderr", ""))
        if outcome["outcome"] != "passed":
            raise RuntimeTestFailure(f"failed inside the Workers runtime:\n{outcome['longrepr']}")

    parameters = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY)
        for n in dict.fromkeys([*fixtures, "workers_runtime"])
    ]
    stub.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = ast.get_docstring(node)
    # Point reports at the test's own file and line, not at this module.
    stub.__code__ = stub.__code__.replace(
        co_filename=str(path), co_firstlineno=node.lineno, co_name=name
    )
    return stub


class RuntimeTestModule(pytest.Module):
    """A test file that runs inside the Workers runtime: read with `ast`, never imported here."""

    def _getobj(self) -> types.ModuleType:
        tree = ast.parse(self.path.read_bytes(), filename=str(self.path))
        project_dir = find_project_dir(self.path.parent)
        module = types.ModuleType(self.path.stem)
        module.__file__ = str(self.path)
        module.__doc__ = ast.get_docstring(tree)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                setattr(module, node.name, _runtime_test_stub(self.path, project_dir, node))
        return module


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    """Collect every test module under the conftest that imports this hook as in-runtime."""
    module: pytest.Module = RuntimeTestModule.from_parent(parent, path=module_path)
    return module


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Show an in-runtime failure as the Pyodide traceback alone (no CPython frames)."""
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, RuntimeTestFailure):
        report.longrepr = str(call.excinfo.value)
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for runtime in _started:
        t = runtime.timings
        terminalreporter.write_line(
            f"workers runtime: ready in {t.get('startMs')} ms "
            f"(loadPyodide {t.get('loadPyodideMs')} ms, import workers "
            f"{t.get('importWorkersMs')} ms, miniflare D1 {t.get('miniflareMs')} ms, "
            "in parallel with Pyodide)"
        )
