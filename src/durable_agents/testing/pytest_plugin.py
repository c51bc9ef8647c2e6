"""Run test functions inside workerd (Pyodide, real D1 and Durable Objects) from pytest.

Each test file in a directory whose `conftest.py` does

    from durable_agents.testing.pytest_plugin import *  # noqa: F403

(this repo: `tests/runtime/`) runs INSIDE the Workers runtime, not in CPython, yet
every test in it is a normal pytest item: selected with `-k`, reported pass/fail
by name, with the Pyodide traceback (and the failing frame's locals, as there is
no assertion rewriting there) on failure.

How, as vitest-pool-workers does it for JavaScript: pytest reads such a file with
`ast` instead of importing it (it may import `js`, `workers` or the vendored
packages) and makes one item per top-level `test_*` function. The session fixture
`workers_runtime` stages a test Worker in `build/runtime-tests/`: the test modules,
every module of pytest's `pythonpath` they import (the kit, shared helpers), and
the runner (`runtime/test_worker.py`) as its entry, with the
project's compatibility date, flags and `[python_modules]`, a D1 database `DB`,
and each Durable Object class the test modules define bound under its own name.
The dev server (`runtime/dev.py`: `wrangler dev` on real workerd) serves it once
per pytest session; each item is one request to it. D1 is emptied before each
test. A test's parameters are pytest fixtures resolved here on CPython (their
values must be JSON) except `env`, the Worker's env inside the runtime. Plain or
`async def` functions; no marks or parametrize decorators (parametrize a CPython
fixture instead, as tests/runtime/conftest.py does).

Needs `scripts/setup-runtime`.

Also here, for ordinary CPython tests of the Worker over HTTP, the fixture
`dev_worker` (a factory of `durable_agents.testing.worker.DevWorker`s). Take it
into a conftest.py:

    from durable_agents.testing.pytest_plugin import dev_worker  # noqa: F401

The guide to both: docs/testing.md.
"""

from __future__ import annotations

import ast
import contextlib
import http.client
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import types
import urllib.parse
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .worker import DevWorker, find_project

__all__ = [
    "WorkersRuntime",
    "dev_worker",
    "pytest_pycollect_makemodule",
    "pytest_runtest_makereport",
    "pytest_terminal_summary",
    "stage_test_worker",
    "workers_runtime",
]

RUNTIME_PARAMETERS = frozenset({"env"})
START_TIMEOUT_S = float(os.environ.get("DURABLE_AGENTS_RUNTIME_START_TIMEOUT", "180"))
TEST_TIMEOUT_S = float(os.environ.get("DURABLE_AGENTS_RUNTIME_TEST_TIMEOUT", "600"))


def find_project_dir(start: Path) -> Path:
    """The repo root: the nearest directory above `start` holding runtime/dev.py."""
    for directory in (start, *start.parents):
        if (directory / "runtime" / "dev.py").is_file():
            return directory
    raise FileNotFoundError(f"no runtime/dev.py above {start}")


class RuntimeTestFailure(AssertionError):
    """A test failed inside the runtime; its text is the Pyodide traceback."""


# -- the test Worker -------------------------------------------------------------------------


def _module_name(project: Path, path: Path) -> str:
    return ".".join(path.relative_to(project).with_suffix("").parts)


def _imports(path: Path) -> Iterator[str]:
    """The absolute module names `path` imports (every prefix of a dotted name)."""
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            yield from (".".join(parts[: i + 1]) for i in range(len(parts)))


# A package's modules and the data it reads (scripts/build_worker.py's DATA_SUFFIXES).
_PACKAGE_FILES = (".py", ".sql", ".html", ".css")


def _find(name: str, roots: list[Path]) -> list[tuple[Path, Path]]:
    """(root, file) of what module `name` needs, from the first of `roots` that has it: a
    module's file; a regular package whole (its modules import each other relatively);
    nothing for a name found nowhere (the stdlib, python_modules) or a namespace package."""
    parts = name.split(".")
    for root in roots:
        top = root / parts[0]
        if (top / "__init__.py").is_file():
            return [
                (root, f)
                for f in sorted(top.rglob("*"))
                if f.suffix in _PACKAGE_FILES and f.is_file() and "__pycache__" not in f.parts
            ]
        module = root.joinpath(*parts).with_suffix(".py")
        if module.is_file():
            return [(root, module)]
        package = root.joinpath(*parts) / "__init__.py"
        if package.is_file():
            return [(root, package)]
    return []


def stage_test_worker(
    project: Path, test_files: Iterable[Path], pythonpath: list[Path], out: Path
) -> dict[str, Any]:
    """Write the test Worker for `test_files` into `out` (replaced): its modules under
    out/src/, a python_modules link, its wrangler.toml. Returns what it holds."""
    test_files = sorted(set(test_files))
    modules: dict[Path, Path] = {}  # target (relative to src/) -> source
    queue = [*test_files]
    seen: set[Path] = set()
    for test_file in test_files:
        modules[test_file.relative_to(project)] = test_file
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            for root, file in _find(name, pythonpath):
                target = file.relative_to(root)
                if target not in modules:
                    modules[target] = file
                    if file.suffix == ".py":  # (not a package's data)
                        queue.append(file)
    durable_objects: dict[str, str] = {}
    for test_file in test_files:
        tree = ast.parse(test_file.read_bytes(), filename=str(test_file))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "DurableObject")
                or (isinstance(b, ast.Attribute) and b.attr == "DurableObject")
                for b in node.bases
            ):
                if node.name in durable_objects:
                    raise pytest.UsageError(
                        f"two in-runtime test modules define a Durable Object class {node.name}: "
                        f"{durable_objects[node.name]} and {test_file}; rename one"
                    )
                durable_objects[node.name] = _module_name(project, test_file)
    if out.exists():
        shutil.rmtree(out)
    src = out / "src"
    for target, source in modules.items():
        (src / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, src / target)
    shutil.copyfile(project / "runtime" / "test_worker.py", src / "_test_runner.py")
    entry = ["from _test_runner import Default  # noqa: F401\n"]
    entry += [
        f"from {module} import {cls}  # noqa: F401\n" for cls, module in durable_objects.items()
    ]
    (src / "entry.py").write_text("".join(entry))
    (out / "python_modules").symlink_to(project / "python_modules", target_is_directory=True)
    (out / "wrangler.toml").write_text(_test_config(project, durable_objects))
    return {"modules": len(modules), "durable_objects": sorted(durable_objects)}


def _test_config(project: Path, durable_objects: dict[str, str]) -> str:
    """The test Worker's config: the project's date, flags and python_modules excludes."""
    config = tomllib.loads((project / "wrangler.toml").read_text())
    lines = [
        'name = "runtime-tests"',
        'main = "src/entry.py"',
        f"compatibility_date = {json.dumps(config['compatibility_date'])}",
        f"compatibility_flags = {json.dumps(config.get('compatibility_flags', []))}",
        "[python_modules]",
        f"exclude = {json.dumps(config.get('python_modules', {}).get('exclude', ['**/*.pyc']))}",
        "[[d1_databases]]",
        'binding = "DB"',
        'database_name = "runtime-tests"',
        'database_id = "00000000-0000-4000-8000-000000000001"',
    ]
    for rule in config.get("rules", []):  # the project's: its package data as Text modules
        lines += ["[[rules]]"] + [f"{key} = {json.dumps(value)}" for key, value in rule.items()]
    for name in durable_objects:
        lines += ["[[durable_objects.bindings]]", f'name = "{name}"', f'class_name = "{name}"']
    if durable_objects:
        classes = json.dumps(sorted(durable_objects))
        lines += ["[[migrations]]", 'tag = "v1"', f"new_sqlite_classes = {classes}"]
    return "\n".join(lines) + "\n"


class WorkersRuntime:
    """The test Worker served by `runtime/dev.py` (real workerd), and a client for it."""

    def __init__(self, project_dir: Path, test_files: list[Path], pythonpath: list[Path]) -> None:
        self.project_dir = project_dir
        self.test_files = test_files
        self.pythonpath = pythonpath
        self.staged: dict[str, Any] = {}
        self.start_s = 0.0
        self._process: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._address: tuple[str, int] = ("127.0.0.1", 0)

    def start(self, state: Path) -> None:
        missing = [
            p
            for p in ("node_modules/wrangler", "python_modules/workers", ".cache/pyodide-bundle")
            if not (self.project_dir / p).exists()
        ]
        if missing:
            raise RuntimeError(
                f"the Workers runtime is not set up (missing: {missing}); run scripts/setup-runtime"
            )
        # One test Worker per pytest process (pytest-xdist runs several).
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        out = self.project_dir / "build" / ("runtime-tests" + (f"-{worker}" if worker else ""))
        self.staged = stage_test_worker(self.project_dir, self.test_files, self.pythonpath, out)
        started = time.perf_counter()
        dev = [sys.executable, str(self.project_dir / "runtime" / "dev.py")]
        self._process = subprocess.Popen(
            [
                *dev,
                "--config",
                str(out / "wrangler.toml"),
                "--port",
                "0",
                "--persist-to",
                str(state),
            ],
            cwd=self.project_dir,
            # One request runs a whole test (a crash sweep makes hundreds of D1 queries):
            # not an invocation WORKERS_PLAN's limits are about.
            env={**os.environ, "DURABLE_AGENTS_DEV_LIMITS": "off"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: stop() takes wrangler and workerd with it
        )
        ready = threading.Event()
        threading.Thread(target=self._read, args=(self._process, ready), daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or self._address[1] == 0:
            self.stop()
            raise RuntimeError(
                f"the Workers runtime did not start within {START_TIMEOUT_S:.0f} s:\n"
                + "\n".join(self._lines[-60:])
            )
        self.start_s = time.perf_counter() - started

    def _read(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._lines.append(line.rstrip("\n"))
            if match := re.match(r"dev: ready on (http://\S+)", line):
                url = urllib.parse.urlsplit(match.group(1))
                self._address = (url.hostname or "127.0.0.1", int(url.port or 0))
                ready.set()
        ready.set()

    def output_since(self, mark: int) -> str:
        """What the Worker printed outside the tests' own stdout since line `mark`."""
        return "\n".join(self._lines[mark:])

    def run_test(
        self, module: str, function: str, kwargs: dict[str, Any], *, reset_d1: bool = True
    ) -> dict[str, Any]:
        """Run one in-runtime test; the outcome as the runtime reports it."""
        try:
            kwargs_json = json.dumps(kwargs)
        except TypeError as exc:
            raise TypeError(
                f"fixture values passed into the runtime must be JSON: {exc}; "
                f"got {sorted(kwargs)} for {function}"
            ) from exc
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(
                "the Workers runtime is not running:\n" + "\n".join(self._lines[-40:])
            )
        body = json.dumps(
            {
                "module": module,
                "function": function,
                "kwargs_json": kwargs_json,
                "reset_d1": reset_d1,
            }
        )
        connection = http.client.HTTPConnection(*self._address, timeout=TEST_TIMEOUT_S)
        try:
            connection.request("POST", "/run", body, {"content-type": "application/json"})
            response = connection.getresponse()
            payload = response.read().decode()
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(
                f"the Workers runtime failed to run {function} ({response.status}): {payload}\n"
                + "\n".join(self._lines[-40:])
            )
        outcome: dict[str, Any] = json.loads(payload)
        return outcome

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


_started: list[WorkersRuntime] = []


@pytest.fixture(scope="session")
def workers_runtime(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkersRuntime]:
    """The test Worker on real workerd, started once per session on first use, stopped at
    its end. It holds every in-runtime test module of the session, selected or not."""
    config = request.config
    project = find_project_dir(Path(str(config.rootpath)))
    files = sorted(
        {item.path for item in request.session.items if isinstance(item.parent, RuntimeTestModule)}
    )
    pythonpath = [Path(str(p)) for p in config.getini("pythonpath")]
    runtime = WorkersRuntime(project, files, pythonpath)
    _started.append(runtime)
    try:
        runtime.start(tmp_path_factory.mktemp("workers-runtime"))  # a failed start still stops it
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
    module_name = _module_name(project_dir, path)
    arguments = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    fixtures = [name for name in arguments if name not in RUNTIME_PARAMETERS]
    name = node.name

    def stub(**kwargs: Any) -> None:
        __tracebackhide__ = True
        runtime: WorkersRuntime = kwargs.pop("workers_runtime")
        outcome = runtime.run_test(module_name, name, kwargs)
        sys.stdout.write(outcome.get("stdout", ""))
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
        if runtime.start_s:
            staged = runtime.staged
            terminalreporter.write_line(
                f"in-runtime tests: workerd started in {runtime.start_s:.1f} s; "
                f"{staged.get('modules')} modules, Durable Objects: "
                f"{', '.join(staged.get('durable_objects', [])) or 'none'}"
            )
