"""Python to the Workers runtime's JS, for streamed answers (Pyodide only; imports `js` lazily).

`readable_stream(chunks)` turns an async iterator of bytes into a JS
`ReadableStream` that a `workers.Response` can carry, written chunk by chunk
as they come (nothing is buffered); `js_chunks(stream)` reads one back as bytes
(another object's streamed answer). `keep_running(ctx, task)` hands a task
to `ctx.waitUntil`, so the Durable Object runs until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from .wire import Reply

__all__ = ["js_chunks", "js_response", "keep_running", "readable_stream"]

_PUMPS: set[asyncio.Task[None]] = set()  # streams being written: kept referenced


def readable_stream(chunks: AsyncIterator[bytes]) -> Any:
    """A JS ReadableStream of `chunks`; whatever produces them (a turn) goes on when the
    client goes away. If the reader cancels, the next write fails and `chunks` is
    closed. workerd (1.20261117.1, locally) does neither for a client that just left:
    the pending write waits until the object is evicted
    (tests/cloudflare/test_dev_server_streaming.py)."""
    import js  # type: ignore[import-not-found, unused-ignore]
    from pyodide.ffi import to_js  # type: ignore[import-not-found, unused-ignore]

    pipe = js.TransformStream.new()
    writer = pipe.writable.getWriter()

    async def pump() -> None:
        try:
            async for chunk in chunks:
                await writer.write(to_js(chunk))
        except Exception:  # the reader cancelled: the client is gone
            with contextlib.suppress(Exception):
                await writer.abort()
            return
        finally:
            closing = getattr(chunks, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()
        with contextlib.suppress(Exception):
            await writer.close()

    task = asyncio.ensure_future(pump())
    _PUMPS.add(task)
    task.add_done_callback(_PUMPS.discard)
    return pipe.readable


async def js_chunks(stream: Any) -> AsyncIterator[bytes]:
    """The bytes of a JS ReadableStream, chunk by chunk as they come (an agent tool's child
    object's SSE, read by the parent's). Left before its end, the stream is cancelled:
    the child's object sees its reader go, as it sees a client's."""
    reader = stream.getReader()
    finished = False
    try:
        while True:
            result = await reader.read()
            if result.done:
                finished = True
                return
            yield bytes(result.value.to_bytes())
    finally:
        if not finished:
            with contextlib.suppress(Exception):
                await reader.cancel()


def keep_running(ctx: Any, task: asyncio.Task[Any]) -> None:
    """`ctx.waitUntil(task)`: with the compatibility flag
    durable_object_io_tasks_prevent_eviction (the default from 2026-10-01), the
    Durable Object is not evicted before `task` ends, client or no client."""
    from pyodide.ffi import create_proxy  # type: ignore[import-not-found, unused-ignore]

    proxy = create_proxy(task)
    task.add_done_callback(lambda _: proxy.destroy())
    ctx.waitUntil(proxy)


def js_response(reply: Reply) -> Any:
    """`reply` as the `workers.Response` a Worker or Durable Object answers with: its
    stream (another object's JS stream as it is, or chunks made here), text or JSON."""
    from workers import Response  # type: ignore[import-not-found, unused-ignore]

    if reply.stream is not None:
        body = reply.stream if hasattr(reply.stream, "getReader") else readable_stream(reply.stream)
        return Response(body, status=reply.status, headers=dict(reply.headers))
    if reply.text is not None:
        return Response(reply.text, status=reply.status, headers=dict(reply.headers))
    return Response(reply.json_text(), status=reply.status, headers=reply.all_headers())
