"""Cloudflare's per-invocation limits, inside a Python Worker that `scripts/dev` serves.

Not imported by anyone on CPython: `runtime/dev_limits.py` stages this file beside the
Worker's modules as `_workers_plan.py`, with a generated main module that calls
`wrap_fetch()`, then imports the Worker's own main and hands it to `enforce()` (see that
module for why and where).

An invocation is one call of a public handler method (fetch, scheduled, alarm, queue,
webSocketMessage, an RPC method...) of a WorkerEntrypoint or DurableObject subclass, or of
a module-level `on_*` handler, made by the runtime: it starts a fresh budget in a context
variable, which every task it starts (`ctx.waitUntil`, `asyncio.create_task`) shares. A
call of such a method from inside an invocation (a helper of the same class) is part of
that invocation. Counted, each against the plan's number (Cloudflare's messages):

- external subrequests: the runtime's `fetch`, however and whenever the Worker reached
  it (`js.fetch`, `from js import fetch` at import or later, the kit's FetchTransport,
  `workers.fetch`, `pyodide.http.pyfetch`): `wrap_fetch`, before the Worker's main is
  imported, makes `globalThis.fetch` a Proxy, counting from the first invocation on; at
  most `connections` of them await their response at once, the others wait (a queue,
  not an error);
- D1 queries: a prepared statement's first/all/run/raw, a database's batch (one query for
  the whole batch), exec and dump;
- other Cloudflare services: KV, R2 and Queue operations, and `fetch` and RPC calls on
  Durable Object stubs and service bindings (through the Workers SDK's wrappers).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections import deque
from typing import Any

import js
from pyodide.ffi import create_once_callable, create_proxy, to_js

SUBREQUESTS = (
    "Too many subrequests by single Worker invocation. To configure this limit, "
    "refer to https://developers.cloudflare.com/workers/wrangler/configuration/#limits"
)
API_REQUESTS = (
    "Too many API requests by single Worker invocation. To configure this limit, "
    "refer to https://developers.cloudflare.com/workers/wrangler/configuration/#limits"
)
D1_QUERIES = ("first", "all", "run", "raw")
D1_DATABASE = ("exec", "dump")  # and batch: D1DatabaseSession's, which D1Database's calls
SERVICES = {
    "KvNamespace": ("get", "getWithMetadata", "put", "delete", "list"),
    "R2Bucket": ("head", "get", "put", "delete", "list", "createMultipartUpload"),
    "WorkerQueue": ("send", "sendBatch"),
}


KINDS = ("subrequests", "d1", "services")  # the traps' kinds, by number (dev_limits.TRAPS)
MESSAGES = (SUBREQUESTS, API_REQUESTS, API_REQUESTS)
GO, OVER, CONNECTED, WAIT = 0, 1, 2, 3  # decide()'s verdicts


class Budget:
    """What one invocation has left: {"subrequests", "d1", "services"} and its connections."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.left = {kind: limits[kind] for kind in KINDS}
        self.connections = limits["connections"]
        self.waiting: deque[Any] = deque()  # JS resolve functions

    def charge(self, kind: str) -> bool:
        self.left[kind] -= 1
        return self.left[kind] >= 0

    def release(self) -> None:
        if self.waiting:
            self.waiting.popleft()()  # the connection passes to the next in line
        else:
            self.connections += 1


_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "workers_plan_budget", default=None
)
_limits: dict[str, int] = {}
_traps: Any = None  # the wasm instance's exports, once installed
_patched: Any = None  # a JS WeakSet of the prototypes patched


# -- what the traps call (see runtime/dev_limits.py, trap_wasm) ---------------------------


def _decide(kind: int) -> int:
    budget = _budget.get()
    if budget is None:  # not in an invocation (module scope, a JS callback)
        return GO
    if not budget.charge(KINDS[kind]):
        return OVER
    if kind != 0:
        return GO
    if budget.connections > 0:
        budget.connections -= 1
        return CONNECTED
    return WAIT


def _error(kind: int) -> Any:
    return js.Error.new(MESSAGES[kind])


def _release() -> Any:
    budget = _budget.get()
    assert budget is not None
    return create_once_callable(budget.release)


def _executor() -> Any:
    """The executor of a Promise that resolves when a connection is free for this call."""
    budget = _budget.get()
    assert budget is not None
    return create_once_callable(lambda resolve, _reject: budget.waiting.append(resolve))


def _trap_imports() -> Any:
    call = js.Function.prototype.call
    # Reflect.get: on a thenable, Pyodide's proxy answers `then` with a Python method.
    promise = js.Promise.prototype
    env = {
        "decide": create_proxy(_decide),
        "apply": js.Reflect.apply,
        "error": create_proxy(_error),
        "reject": js.Promise.reject.bind(js.Promise),
        "release": create_proxy(_release),
        "finally": call.bind(js.Reflect.get(promise, "finally")),
        "executor": create_proxy(_executor),
        "array_of": js.Array.of.bind(js.Array),
        "construct": js.Reflect.construct.bind(None, js.Promise),
        "then": call.bind(js.Reflect.get(promise, "then")),
        "bind_apply": js.Function.prototype.bind.bind(js.Reflect.apply, None),
    }
    return to_js({"env": env}, dict_converter=js.Object.fromEntries)


def _handler(kind: str) -> Any:
    handler = js.Object.new()
    handler.apply = getattr(_traps, f"apply_{'fetch' if kind == 'subrequests' else kind}")
    return handler


def _patch(owner: Any, names: tuple[str, ...], kind: str) -> None:
    """Replace owner's methods `names` by Proxies that charge `kind` (once per owner)."""
    global _patched
    if _patched is None:
        _patched = js.WeakSet.new()
    if owner is None or _patched.has(owner):
        return
    _patched.add(owner)
    handler = _handler(kind)
    for name in names:
        original = getattr(owner, name, None)
        if getattr(original, "typeof", None) == "function":
            setattr(owner, name, js.Proxy.new(original, handler))


_fetch_handler: Any = None  # the handler of the Proxy that globalThis.fetch is


def wrap_fetch() -> None:
    """Make `globalThis.fetch` a Proxy before the Worker's modules are imported (the
    generated main calls this first), so that a name bound to it at import is the Proxy
    too: `from js import fetch`, pyfetch's (`workers.fetch`), `js.fetch` at any time. Its
    handler has no trap (a call goes straight to the runtime's fetch) until the first
    invocation installs the traps (`_install`): the wasm module cannot be had before."""
    global _fetch_handler
    if _fetch_handler is not None:
        return
    _fetch_handler = js.Object.new()
    js.globalThis.fetch = js.Proxy.new(js.globalThis.fetch, _fetch_handler)
    try:  # pyfetch took `fetch` from `js` when it was imported (if it was already)
        import pyodide.http._pyfetch as pyfetch
    except ImportError:
        return
    pyfetch._jsfetch = js.fetch


def _patch_fetch() -> None:
    wrap_fetch()  # done at import by the generated main; here for a main that did not
    _fetch_handler.apply = _traps.apply_fetch


def _rejected(message: str) -> Any:
    return js.Promise.reject(js.Error.new(message))


def _patch_sdk() -> None:
    """Durable Object stubs and service bindings, as the Workers SDK wraps them."""
    try:
        from workers import rpc
    except ImportError:
        return
    wrapper = rpc._FetcherWrapper
    sdk_fetch, sdk_invoke = wrapper.fetch, wrapper._conver_and_invoke

    def fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget.get()
        if budget is not None and not budget.charge("services"):
            reject = js.Promise.reject.bind(js.Promise, js.Error.new(API_REQUESTS))
            return rpc.fetch(*args, fetcher=reject, **kwargs)  # rejects as the runtime would
        return sdk_fetch(self, *args, **kwargs)

    def invoke(self: Any, fn: Any, args: Any, kwargs: Any) -> Any:
        budget = _budget.get()
        if budget is not None and not budget.charge("services"):
            return _rejected(API_REQUESTS)
        return sdk_invoke(self, fn, args, kwargs)

    wrapper.fetch, wrapper._conver_and_invoke = fetch, invoke


def _patch_bindings(env: Any) -> None:
    """The D1, KV, R2 and Queue bindings' prototypes (shared by every instance)."""
    raw = getattr(env, "_env", env)  # the SDK's env wrapper, or the JS env
    try:
        names = [str(name) for name in js.Object.keys(raw)]
    except Exception:
        return
    for name in names:
        binding = getattr(raw, name, None)
        kind = _constructor(binding)
        if kind == "D1Database":
            # One count a query: D1Database's batch/exec/dump call its session's at once.
            statement = binding.prepare("SELECT 1")  # no query until it runs
            _patch(js.Object.getPrototypeOf(statement), D1_QUERIES, "d1")
            if getattr(getattr(binding, "withSession", None), "typeof", None) == "function":
                session = js.Object.getPrototypeOf(binding.withSession())
                while session is not None and not js.Object.hasOwn(session, "batch"):
                    session = js.Object.getPrototypeOf(session)
                _patch(js.Object.getPrototypeOf(binding), D1_DATABASE, "d1")
                _patch(session, ("batch",), "d1")
            else:
                _patch(js.Object.getPrototypeOf(binding), (*D1_DATABASE, "batch"), "d1")
        elif kind in SERVICES:
            _patch(js.Object.getPrototypeOf(binding), SERVICES[kind], "services")


def _constructor(value: Any) -> str:
    if getattr(value, "typeof", None) != "object":
        return ""
    try:
        return str(value.constructor.name)
    except Exception:
        return ""


def _invocation_env(args: tuple[Any, ...], kwargs: dict[str, Any], method: bool) -> Any:
    if method:
        return getattr(args[0], "env", None) if args else None
    return kwargs.get("env", args[1] if len(args) > 1 else None)


_installing: asyncio.Future[None] | None = None


async def _install(env: Any) -> None:
    """The traps (the wasm module, a bundle module: imported, so only in an invocation, the
    first), then the runtime's fetch, the SDK's stubs and env's bindings."""
    global _traps
    import _pyodide_entrypoint_helper

    try:
        module = await _pyodide_entrypoint_helper.doAnImport(f"{__name__}.wasm")
        _traps = js.WebAssembly.Instance.new(module.default, _trap_imports()).exports
        _patch_fetch()
        _patch_sdk()
        if env is not None:
            _patch_bindings(env)
    except Exception as exc:
        print(f"WORKERS_PLAN: the limits are not enforced: {type(exc).__name__}: {exc}")


async def _installed(env: Any) -> None:
    global _installing
    if _installing is None:
        _installing = asyncio.ensure_future(_install(env))
    await _installing


def _invocation(function: Any, method: bool) -> Any:
    """`function` as an invocation: a fresh budget, unless called inside one."""
    if getattr(function, "__workers_plan__", False):
        return function
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)  # keeps the signature: the runtime's relaxed_call reads it
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            if _budget.get() is not None:
                return await function(*args, **kwargs)
            if _installing is None or not _installing.done():
                await _installed(_invocation_env(args, kwargs, method))
            token = _budget.set(Budget(_limits))
            try:
                return await function(*args, **kwargs)
            finally:
                _budget.reset(token)

        wrapped: Any = run_async
    else:

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            if _budget.get() is not None:
                return function(*args, **kwargs)
            budget = Budget(_limits)
            token = _budget.set(budget)
            try:
                result = function(*args, **kwargs)
            finally:
                _budget.reset(token)
            return _within(budget, result) if inspect.isawaitable(result) else result

        wrapped = run
    wrapped.__workers_plan__ = True
    return wrapped


async def _within(budget: Budget, awaitable: Any) -> Any:
    token = _budget.set(budget)
    try:
        return await awaitable
    finally:
        _budget.reset(token)


def _wrap_class(cls: type, bases: tuple[type, ...]) -> None:
    """Each public method of `cls` (its own or inherited, but not the SDK's) as an
    invocation, set on `cls` itself: in place, so the SDK's __init_subclass__ does not run
    again."""
    sdk = {name for base in bases for klass in base.__mro__ for name in vars(klass)}
    for name in dir(cls):
        if name.startswith("_") or name in sdk:
            continue
        if inspect.isfunction(inspect.getattr_static(cls, name)):
            setattr(cls, name, _invocation(getattr(cls, name), method=True))


def enforce(module: Any, limits: dict[str, int]) -> dict[str, Any]:
    """The names of the Worker's main `module`, its handlers wrapped; the runtime's fetch and
    the SDK's stubs patched. The generated main module puts these in its globals."""
    from workers import DurableObject, WorkerEntrypoint

    _limits.update(limits)
    bases = (WorkerEntrypoint, DurableObject)
    exported: dict[str, Any] = {}
    for name, value in vars(module).items():  # the runtime looks handlers up by name
        if name.startswith("__"):
            continue
        if inspect.isclass(value) and issubclass(value, bases) and value not in bases:
            _wrap_class(value, bases)
        elif name.startswith("on_") and inspect.isfunction(value):
            value = _invocation(value, method=False)
        exported[name] = value
    return exported
