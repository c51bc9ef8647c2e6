"""What runs only on Cloudflare Workers: the D1 store and an httpx transport over `fetch`.

- `d1_store(env.DB)`: the durable store of a Worker, over a D1 binding.
- `durable_object_store(self.ctx.storage)`: the durable store in a Durable
  Object's own SQLite (local, synchronous, per object).
- `FetchTransport`: an httpx transport over the runtime's JS `fetch`, for
  LLM calls from a Worker (httpx's own transport needs sockets). Importing
  this package under Pyodide makes it the default transport of
  `durable_agents.llm.default_client`, so every client the kit builds in a
  Worker (the LLM adapters', the tools' `http`) uses it.

Both import on CPython (they touch `js`/`pyodide` only when called), so code
that builds them type-checks and tests there; `testing.fake_d1` stands in
for a D1 binding.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .._http.client import set_default_transport
from ..stores.d1 import D1Store, d1_store
from .fetch_transport import FetchTransport, InvocationLimitError

if TYPE_CHECKING:
    from ..stores.durable_object import DurableObjectStore, durable_object_store

if sys.platform == "emscripten":
    set_default_transport(FetchTransport)


def __getattr__(name: str) -> Any:
    # The Durable Object store loads on first use: a Worker with SESSION_STORE=d1 (the
    # default) never needs it, and its import is part of every start.
    if name in ("DurableObjectStore", "durable_object_store"):
        from ..stores import durable_object

        return getattr(durable_object, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "D1Store",
    "DurableObjectStore",
    "FetchTransport",
    "InvocationLimitError",
    "d1_store",
    "durable_object_store",
]
