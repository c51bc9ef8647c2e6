"""The Worker scripts/bench_d1.py serves: it times the kit's D1 store from inside workerd.

    GET /?appends=200&loads=50&run=<id>   -> JSON: the times of each append and load, in ms

Not a module of this repository's Worker: scripts/bench_d1.py stages it as the `entry.py`
of a Worker of its own (with the modules of `durable_agents` it imports, and the kit's
python_modules/), whose D1 binding `DB` has the kit's migrations applied.

Each append is one `append_messages_atomic` of 5 messages (a question, a tool call, its
result, the answer, a thank-you): one D1 `batch()` of 5 INSERTs and the session upsert,
a single round trip to D1. Sessions `bench-<run>-0` to `-19` take turns, so each append
follows the stored ones. Each load is `load_messages` of a 5-message session.

workerd's clock stands still while code runs and moves on at I/O: an append timed here
runs from the end of the previous I/O to the end of its own batch, its Python work
(building the statements) and its round trip to D1 together.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from workers import Response, WorkerEntrypoint

from durable_agents.cloudflare import d1_store
from durable_agents.messages import Message, ToolCall, Usage

SESSIONS = 20


def batch(n: int) -> list[Message]:
    call = ToolCall(f"call-{n}", "lookup", {"query": "weather in Lisbon", "n": n})
    return [
        Message.user(f"question {n}"),
        Message.assistant("", [call], Usage(120, 30)),
        Message.tool_result(call, '{"temperature": 21, "unit": "C"}'),
        Message.assistant(f"It is 21 C ({n}).", usage=Usage(150, 12)),
        Message.user("thanks"),
    ]


class Default(WorkerEntrypoint):  # type: ignore[misc]  # the workers SDK ships no stubs
    async def fetch(self, request: Any) -> Any:
        query = parse_qs(urlsplit(str(request.url)).query)
        appends = int(query.get("appends", ["200"])[0])
        loads = int(query.get("loads", ["50"])[0])
        run = query.get("run", ["run"])[0]
        store = d1_store(self.env.DB)

        for n in range(10):  # warm up: the statements' first use, the connection
            await store.append_messages_atomic(f"warm-{run}-{n}", 0, batch(n))

        append_ms = []
        for n in range(appends):
            session, seq = f"bench-{run}-{n % SESSIONS}", (n // SESSIONS) * 5
            t0 = time.perf_counter()
            await store.append_messages_atomic(session, seq, batch(n))
            append_ms.append((time.perf_counter() - t0) * 1000)

        load_ms = []
        for n in range(loads):
            t0 = time.perf_counter()
            messages = await store.load_messages(f"warm-{run}-{n % 10}")
            load_ms.append((time.perf_counter() - t0) * 1000)
            assert len(messages) == 5, len(messages)

        stored = await store.load_messages(f"bench-{run}-0")
        body = {"append_ms": append_ms, "load_ms": load_ms, "stored_in_first_session": len(stored)}
        return Response(json.dumps(body), headers={"content-type": "application/json"})
