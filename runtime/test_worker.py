"""The Worker that runs in-runtime tests inside workerd, for `durable_agents.testing.pytest_plugin`.

Never imported on CPython (it is no module of the kit): the plugin stages this file as a
module of a test Worker (beside the test modules and what they import) and serves that
Worker with the dev server (`runtime/dev.py`, real workerd). pytest then sends each test here:

    POST /run  {"module": "tests.runtime.test_x", "function": "test_y",
                "kwargs_json": "{...}", "reset_d1": true}
    -> 200 {"outcome": "passed" | "failed", "longrepr": str, "stdout": str, "duration": s}

A test is a plain or `async def` function; its parameters are pytest fixtures resolved on
CPython and sent as JSON, except `env`: the Worker's env, as Python code on Cloudflare
gets it. Every Durable Object class a test module defines is bound under its own class
name (`env.StoreProbe`), so a test makes a fresh object with `newUniqueId()`. Before each
test (`reset_d1`), every table of the D1 database `env.DB` is dropped.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import time
import traceback
from typing import Any

from workers import Response, WorkerEntrypoint

RUNTIME_PARAMETERS = frozenset({"env"})
_KEEP_TABLES = ("sqlite_%", "_cf_%", "d1_migrations")


async def reset_d1(database: Any) -> None:
    """Drop every table the tests made (D1 keeps its own)."""
    keep = " AND ".join("name NOT LIKE ?" for _ in _KEEP_TABLES)
    query = f"SELECT name FROM sqlite_master WHERE type = 'table' AND {keep}"
    rows = (await database.prepare(query).bind(*_KEEP_TABLES).all())["results"]
    drops = [database.prepare(f'DROP TABLE IF EXISTS "{row["name"]}"') for row in rows]
    if drops:
        await database.batch(drops)


def describe_failure(exc: BaseException) -> str:
    """The traceback from the test down, and (no assertion rewriting here) the failing
    frame's locals for an AssertionError."""
    if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None:
        exc = exc.with_traceback(exc.__traceback__.tb_next)
    text = "".join(traceback.format_exception(exc))
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


async def run_test(env: Any, module_name: str, function: str, kwargs_json: str) -> dict[str, Any]:
    started = time.perf_counter()
    outcome, longrepr = "passed", ""
    output = io.StringIO()
    # Only stdout: Pyodide formats a JS error raised from Python code through sys.stderr.
    with contextlib.redirect_stdout(output):
        try:
            test = getattr(importlib.import_module(module_name), function)
            kwargs: dict[str, Any] = json.loads(kwargs_json)
            if "env" in inspect.signature(test).parameters:
                kwargs["env"] = env
            result = test(**kwargs)
            if inspect.isawaitable(result):
                await result
        except BaseException as exc:  # SimulatedCrash and the like are BaseExceptions
            outcome, longrepr = "failed", describe_failure(exc)
    return {
        "outcome": outcome,
        "longrepr": longrepr,
        "stdout": output.getvalue(),
        "duration": time.perf_counter() - started,
    }


class Default(WorkerEntrypoint):  # type: ignore[misc]  # the workers SDK ships no stubs
    async def fetch(self, request: Any) -> Any:
        if request.method != "POST" or not str(request.url).endswith("/run"):
            return Response("POST /run", status=404)
        body = json.loads(await request.text())
        if body.get("reset_d1", True):
            await reset_d1(self.env.DB)
        outcome = await run_test(self.env, body["module"], body["function"], body["kwargs_json"])
        return Response(json.dumps(outcome), headers={"content-type": "application/json"})
