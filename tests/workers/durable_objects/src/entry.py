"""Durable Objects with ctx.storage: a notebook on the KV API, a counter on the SQL API.

Test fixture: /<notebook>/add/<note>, /<notebook>/show, /<notebook>/keys,
/counter/<name>/bump, /counter/<name>/bump-twice-then-fail, /counter/<name>.
"""

from urllib.parse import urlparse

from workers import DurableObject, Response, WorkerEntrypoint


class Notebook(DurableObject):
    async def notes(self):
        stored = await self.ctx.storage.get("notes")
        return list(stored) if stored else []

    async def add(self, note):
        notes = await self.notes()
        notes.append(note)
        await self.ctx.storage.put("notes", notes)
        await self.ctx.storage.put(f"note:{len(notes):03}", {"text": note, "n": len(notes)})
        return len(notes)

    async def keys(self):
        listed = await self.ctx.storage.list({"prefix": "note:", "limit": 10})
        return {"keys": list(listed.keys()), "deleted": await self.ctx.storage.delete("missing")}


class Counter(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.sql = ctx.storage.sql
        self.sql.exec("CREATE TABLE IF NOT EXISTS hits (name TEXT PRIMARY KEY, n INTEGER NOT NULL)")

    def _bump(self, name):
        self.sql.exec(
            "INSERT INTO hits (name, n) VALUES (?, 1) ON CONFLICT(name) DO UPDATE SET n = n + 1",
            name,
        )

    async def bump(self, name):
        self._bump(name)
        return self.sql.exec("SELECT n FROM hits WHERE name = ?", name).one()["n"]

    async def bump_twice_then_fail(self, name):
        def both():
            self._bump(name)
            self._bump(name)
            raise ValueError("rolled back")

        try:
            self.ctx.storage.transactionSync(both)
        except Exception as error:
            return f"failed: {'rolled back' in str(error)}"
        return "committed"

    async def report(self, name):
        cursor = self.sql.exec("SELECT name, n FROM hits WHERE name = ?", name)
        rows = [dict(row) for row in cursor]
        write = self.sql.exec("UPDATE hits SET n = n WHERE name = ?", name)
        return {
            "rows": rows,
            "columns": list(cursor.columnNames),
            "rowsRead": cursor.rowsRead,
            "rowsWritten": write.rowsWritten,
            "all": [dict(r) for r in self.sql.exec("SELECT name FROM hits").toArray()],
        }


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        parts = urlparse(request.url).path.strip("/").split("/")
        if parts[0] == "counter" and len(parts) >= 2:
            stub = self.env.COUNTERS.get(self.env.COUNTERS.idFromName(parts[1]))
            action = parts[2] if len(parts) > 2 else ""
            if action == "bump":
                return Response.json({"n": await stub.bump(parts[1])})
            if action == "bump-twice-then-fail":
                return Response(await stub.bump_twice_then_fail(parts[1]))
            return Response.json(await stub.report(parts[1]))
        stub = self.env.NOTEBOOKS.get(self.env.NOTEBOOKS.idFromName(parts[0]))
        if len(parts) == 3 and parts[1] == "add":
            return Response.json({"count": await stub.add(parts[2])})
        if parts[1:] == ["show"]:
            return Response("\n".join(await stub.notes()) or "No notes")
        if parts[1:] == ["keys"]:
            return Response.json(await stub.keys())
        return Response("not found", status=404)
