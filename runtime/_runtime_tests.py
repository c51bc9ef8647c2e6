"""Runs one test function inside Pyodide for `durable_agents.testing.pytest_plugin`.

pytest, on CPython, collects the files under tests/runtime/ without importing
them and asks the runtime (runtime/test-server.mjs) to run each test here. A
test is a plain (async) function; its parameters are pytest fixtures resolved
on the CPython side and sent as JSON, except `env`, which is the Worker env
as Python code sees it on Cloudflare (`from workers import env`).

Test modules are imported the way pytest's default "prepend" mode imports
them: the first directory above the file without `__init__.py` goes on
sys.path, so helpers beside a test import as they do under pytest.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

PROJECT = Path("/project")
RUNTIME_PARAMETERS = frozenset({"env"})


def _import_test_module(relative_path: str) -> ModuleType:
    path = (PROJECT / relative_path).resolve()
    base = path.parent
    parts = [path.stem]
    while (base / "__init__.py").exists():
        parts.insert(0, base.name)
        base = base.parent
    # As under pytest: the test's own folder, and tests/ (where the shared
    # helpers such as history_checks and crash_sweep live, beside conftest.py).
    for folder in (PROJECT / "tests", base):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return importlib.import_module(".".join(parts))


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
