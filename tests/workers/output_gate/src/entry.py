"""A Durable Object that writes and fetches a URL in the same step (test fixture,
tests/cloudflare/test_output_gate.py: workerd's output gate).

- /do/<name>/write-then-fetch?key=K&url=U&size=N: inserts row K (with N random bytes)
  into `notes` with `sql.exec`, then, with no await in between, fetches U?key=K with
  the global fetch; answers {"status", "body"} of that fetch, or {"error"}.
- /do/<name>/put-unconfirmed-then-fetch?key=K&url=U&size=N: the same with the KV API's
  `storage.put(K, N bytes, {allowUnconfirmed: true})`, which asks workerd not to hold
  the object's output for that write.
- /do/<name>/rows: the keys in `notes`.
"""

import json
from urllib.parse import parse_qs, urlparse

import js
from pyodide.ffi import to_js
from workers import DurableObject, Response, WorkerEntrypoint


class Writer(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        sql = self.ctx.storage.sql
        sql.exec("CREATE TABLE IF NOT EXISTS notes (key TEXT PRIMARY KEY, data BLOB)")
        sql.exec(
            "CREATE TABLE IF NOT EXISTS links"
            " (key TEXT PRIMARY KEY, note TEXT REFERENCES notes (key))"
        )

    async def fetch(self, request):
        url = urlparse(request.url)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        sql = self.ctx.storage.sql
        if url.path == "/rows":
            return Response.json(
                [row.key for row in sql.exec("SELECT key FROM notes ORDER BY key")]
            )
        key, size = query.get("key", ""), int(query.get("size", "0"))
        if url.path == "/write-then-fetch":
            if query.get("fail") == "1":
                # A foreign key checked at commit, not at the INSERT: the commit fails.
                sql.exec("PRAGMA defer_foreign_keys = ON")
                sql.exec("INSERT INTO links (key, note) VALUES (?, 'no such note')", key)
            sql.exec("INSERT INTO notes (key, data) VALUES (?, randomblob(?))", key, size)
        elif url.path == "/put-unconfirmed-then-fetch":
            options = to_js({"allowUnconfirmed": True}, dict_converter=js.Object.fromEntries)
            self.ctx.storage.put(key, "x" * size, options)
        else:
            return Response("not found", status=404)
        try:
            answer = await js.fetch(f"{query['url']}?key={key}")
            return Response.json({"status": answer.status, "body": await answer.text()})
        except Exception as error:  # the fetch failed
            return Response.json({"error": str(error)})


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlparse(request.url)
        parts = url.path.strip("/").split("/", 2)
        if len(parts) == 3 and parts[0] == "do":
            stub = self.env.WRITERS.getByName(parts[1])
            return await stub.fetch(f"http://do/{parts[2]}?{url.query}")
        return Response(json.dumps({"parts": parts}), status=404)
