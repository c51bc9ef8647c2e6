"""A Durable Object that answers a body it writes from an asyncio task, chunk by chunk.

Test fixture (tests/cloudflare/test_dev_server_streaming.py):
- /do/<name>/stream?chunks=N&delay=S: the object's answer, as the stub gave it: an SSE
  body of N events `data: {"i", "written_at"}`, S seconds apart, written by a task the
  object hands to ctx.waitUntil (the readable side of a TransformStream); with
  `abort_after=K` the task aborts the stream before event K; with `as=text` it writes
  strings, not bytes (workerd sends them as text);
- /do/<name>/rewrap?...: the same body in a new Response (the Worker's own status and
  headers around the object's JS ReadableStream);
- /do/<name>/report: what the object's tasks did: per stream, chunks written, writes
  that failed (the client went away), and whether the task finished;
- /text: a complete body; /empty: 204 without one.
"""

import asyncio
import contextlib
import json
import time
from urllib.parse import parse_qs, urlparse

import js
from pyodide.ffi import create_proxy, to_js
from workers import DurableObject, Response, WorkerEntrypoint

SSE = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


class Streamer(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.runs = []

    async def fetch(self, request):
        url = urlparse(request.url)
        if url.path == "/report":
            return Response.json({"runs": self.runs})
        query = parse_qs(url.query)
        chunks = int(query.get("chunks", ["5"])[0])
        delay = float(query.get("delay", ["0.2"])[0])
        abort_after = int(query.get("abort_after", ["-1"])[0])
        as_text = query.get("as", [""])[0] == "text"
        run = {"chunks": chunks, "written": 0, "failed": 0, "finished": False}
        self.runs.append(run)
        pipe = js.TransformStream.new()
        writer = pipe.writable.getWriter()

        async def write_all():
            for i in range(chunks):
                if i == abort_after:
                    with contextlib.suppress(Exception):
                        await writer.abort(js.Error.new("the object broke its stream"))
                if i:
                    await asyncio.sleep(delay)
                event = {"i": i, "written_at": time.time()}
                text = f"data: {json.dumps(event)}\n\n"
                try:
                    await writer.write(text if as_text else to_js(text.encode()))
                    run["written"] += 1
                except Exception:  # the reader cancelled (the client went away): go on
                    run["failed"] += 1
            with contextlib.suppress(Exception):
                await writer.close()
            run["finished"] = True

        task = asyncio.ensure_future(write_all())
        proxy = create_proxy(task)
        task.add_done_callback(lambda _: proxy.destroy())
        self.ctx.waitUntil(proxy)
        return Response(pipe.readable, headers=SSE)


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlparse(request.url)
        parts = url.path.strip("/").split("/")
        if parts == ["text"]:
            return Response("a body that is complete")
        if parts == ["empty"]:
            return Response(None, status=204)
        if len(parts) == 3 and parts[0] == "do" and parts[2] in ("stream", "rewrap", "report"):
            stub = self.env.STREAMERS.getByName(parts[1])
            path = "report" if parts[2] == "report" else "stream"
            answer = await stub.fetch(f"https://streamer.internal/{path}?{url.query}")
            if parts[2] == "rewrap":
                headers = {**SSE, "x-rewrapped": "yes"}
                return Response(answer.js_object.body, status=int(answer.status), headers=headers)
            return answer
        return Response("not found", status=404)
