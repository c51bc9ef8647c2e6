"""Runs one test function inside Pyodide for `durable_agents.testing.pytest_plugin`.

pytest, on CPython, collects the files under tests/runtime/ without importing
them and asks the runtime (runtime/test-server.mjs) to run each test here. A
test is a plain (async) function; its parameters are pytest fixtures resolved
on the CPython side and sent as JSON, except `env`, which is the Worker env
as Python code sees it on Cloudflare (`from workers import env`).

Test modules are imported as pytest imports them (`--import-mode=importlib`):
by path, adding nothing to sys.path; what they import comes from the same
`pythonpath` list as under pytest, read from pyproject.toml's
`[tool.pytest.ini_options]`, so helpers import alike in both places.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import time
import tomllib
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

PROJECT = Path("/project")
RUNTIME_PARAMETERS = frozenset({"env"})


def _pytest_pythonpath() -> list[Path]:
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    entries = config["tool"]["pytest"]["ini_options"].get("pythonpath", [])
    return [(PROJECT / entry).resolve() for entry in entries]


def _import_test_module(relative_path: str) -> ModuleType:
    for folder in reversed(_pytest_pythonpath()):  # first entry first, as pytest does
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    name = relative_path.removesuffix(".py").replace("/", ".")
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, PROJECT / relative_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {relative_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _describe_failure(exc: BaseException) -> str:
    # Start the traceback at the test, not at this runner.
    if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None:
        exc = exc.with_traceback(exc.__traceback__.tb_next)
    text = "".join(traceback.format_exception(exc))
    # No assertion rewriting here: show the failing frame's locals instead.
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and isinstance(exc, AssertionError):
        shown = []
        for name, value in tb.tb_frame.f_locals.items():
            try:
                text_value = repr(value)
            except Exception as repr_error:  # a broken __repr__ must not hide the failure
                text_value = f"<repr failed: {repr_error!r}>"
            if len(text_value) > 400:
                text_value = text_value[:400] + f"... ({len(text_value)} chars)"
            shown.append(f"    {name} = {text_value}")
        if shown:
            text += "\nlocals of the failing frame:\n" + "\n".join(shown) + "\n"
    return text


async def run_test(relative_path: str, function: str, kwargs_json: str) -> str:
    """Run one test; return JSON {outcome, longrepr, duration}.

    Output is captured by the test server around this call (Pyodide's own
    streams), not by swapping sys.stdout/sys.stderr: Pyodide formats a
    PythonError's message through sys.stderr, so a swapped stderr would leave
    JS errors raised from Python code (RPC errors, say) with an empty message.
    """
    started = time.perf_counter()
    outcome, longrepr = "passed", ""
    try:
        module = _import_test_module(relative_path)
        test = getattr(module, function)
        kwargs: dict[str, Any] = json.loads(kwargs_json)
        parameters = inspect.signature(test).parameters
        if "env" in parameters:
            import workers

            kwargs["env"] = workers.env
        result = test(**kwargs)
        if inspect.isawaitable(result):
            await result
    except BaseException as exc:  # report everything, including SimulatedCrash-style BaseExceptions
        outcome, longrepr = "failed", _describe_failure(exc)
    return json.dumps(
        {
            "outcome": outcome,
            "longrepr": longrepr,
            "duration": time.perf_counter() - started,
        }
    )
