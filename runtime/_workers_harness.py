"""Python side of the local Workers runtime (runtime/*.mjs): what workerd does around a handler.

workerd, not the `workers` SDK, converts a Python handler's arguments and
result. For each event it builds a new instance of the Python class from the
raw JS ctx and env, passes every argument through `workers.python_from_rpc`,
awaits the method, and returns `workers.python_to_rpc(result)` to JS. The
harness calls `instantiate` and `invoke` below for the same effect, so code
under test sees exactly the objects it sees on Cloudflare.

Only the harness imports this module; it runs inside Pyodide.
"""

from __future__ import annotations

import inspect
from typing import Any


def instantiate(cls: type, ctx: Any, env: Any) -> Any:
    """A new instance of a WorkerEntrypoint or DurableObject class, built as workerd builds it."""
    return cls(ctx, env)


async def invoke(instance: Any, method: str, js_args: Any) -> Any:
    """Call `instance.method(*args)` with RPC conversion in and out; return a JS value."""
    from workers import python_from_rpc, python_to_rpc

    handler = getattr(instance, method, None)
    if handler is None or not callable(handler):
        raise TypeError(
            f"The RPC receiver {type(instance).__name__} does not implement the method {method!r}."
        )
    result = handler(*(python_from_rpc(arg) for arg in js_args))
    if inspect.isawaitable(result):
        result = await result
    return python_to_rpc(result)
