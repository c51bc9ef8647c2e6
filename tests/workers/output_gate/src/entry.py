"""A Durable Object that writes a row and fetches a URL in the same step.

Test fixture (tests/test_runtime_output_gate.py):
- /do/<name>/write-then-fetch?key=K&url=U: inserts row K into `notes` with
  `sql.exec`, then (no await in between) fetches U?key=K with the global fetch;
  answers {"status", "body"} of that fetch, or {"error"} if it failed. With
  `fail=1` the object first asks the runtime (test hook) to fail its next commit.
- /do/<name>/rows: the keys the object has.
- /do/<name>/bench?n=N&fetch=U: N writes (one `sql.exec` per event step, each
  followed by an await of a fetch to U when given): the time taken.
"""

import json
import time
from urllib.parse import parse_qs, urlparse

import js
from workers import DurableObject, Response, WorkerEntrypoint


class Writer(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS notes (key TEXT PRIMARY KEY, at REAL)"
        )

    async def fetch(self, request):
        url = urlparse(request.url)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        sql = self.ctx.storage.sql
        if url.path == "/rows":
            return Response.json(
                [row.key for row in sql.exec("SELECT key FROM notes ORDER BY key")]
            )
        if url.path == "/write-then-fetch":
            key = query["key"]
            if query.get("fail") == "1":
                self.ctx.storage.failNextCommitForTests("injected by the test")
            sql.exec("INSERT INTO notes (key, at) VALUES (?, ?)", key, time.time())
            try:
                answer = await js.fetch(f"{query['url']}?key={key}")
                return Response.json({"status": answer.status, "body": await answer.text()})
            except Exception as error:  # the fetch was dropped
                return Response.json({"error": str(error)})
        if url.path == "/bench":
            n = int(query.get("n", "100"))
            start = time.perf_counter()
            for i in range(n):
                sql.exec("INSERT OR REPLACE INTO notes (key, at) VALUES (?, ?)", f"bench-{i}", 0)
                if query.get("fetch"):
                    await js.fetch(query["fetch"])
            return Response.json({"n": n, "seconds": time.perf_counter() - start})
        return Response("not found", status=404)


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlparse(request.url)
        parts = url.path.strip("/").split("/", 2)
        if len(parts) == 3 and parts[0] == "do":
            stub = self.env.WRITERS.getByName(parts[1])
            rest = f"http://do/{parts[2]}?{url.query}"
            return await stub.fetch(rest)
        return Response(json.dumps({"parts": parts}), status=404)
