"""A probe of real workerd, where the kit depends on what it does (test fixture for
tests/cloudflare/test_workerd_behaviour.py). Every answer is JSON; a value to bind is sent
as text (`true`, `false` or an integer), so no RPC hop converts it before the bind.

    GET /cwd                 the working directory at import and now
    GET /imports             `import pydantic`, `import pydantic.v1` (excluded by the config)
    GET /scheduled           what each scheduled() call received (recorded in D1)
    GET /d1/bind?v=          bind v to D1 (through the SDK's env.DB), read it back
    GET /do/bind?v=&via=     bind v to the Durable Object's SQL (via=js: ctx.storage's JS
                             object, as the kit's store does; via=sdk: the SDK's wrapper)
    GET /d1/sql?q=           one D1 statement: its rows (each cell as [type, repr]) or error
    GET /do/sql?q=&q=        each q one `sql.exec` in the Durable Object: their rows or error
    GET /do/transaction      transactionSync: a callback that raises, then one that returns
    GET /do/master           sqlite_master's names after a KV put, and reading _cf_KV
"""

import importlib
import json
import os
from urllib.parse import parse_qs, urlparse

import js
from pyodide.ffi import create_proxy, jsnull
from workers import DurableObject, Response, WorkerEntrypoint

CWD_AT_IMPORT = os.getcwd()
SCHEDULED_TABLE = (
    "CREATE TABLE IF NOT EXISTS scheduled_calls (n INTEGER PRIMARY KEY, call TEXT NOT NULL)"
)
BINDS_TABLE = "CREATE TABLE IF NOT EXISTS binds (v)"  # no type affinity: keeps what was bound


def _json(data):
    return Response(json.dumps(data), headers={"content-type": "application/json"})


def _error(exc):
    return f"{type(exc).__name__}: {exc}"


def _value(text):
    return {"true": True, "false": False}[text] if text in ("true", "false") else int(text)


def _cell(value):
    """A read-back value as JSON keeps it exactly: its Python type and its repr."""
    return [type(value).__name__, repr(value)]


def _describe(value):
    """What a value passed to a handler is: its JS tag, its own keys, which names are in it."""
    if not hasattr(value, "js_id"):  # not a JS object
        return {"python": type(value).__name__}
    return {
        "tag": str(js.Object.prototype.toString.call(value)),
        "keys": sorted(str(k) for k in js.Object.keys(value)),
        "in": sorted(
            name
            for name in ("DB", "PROBES", "waitUntil", "passThroughOnException", "cron")
            if js.Reflect.has(value, name)
        ),
    }


def _try_import(name):
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        return {"ok": False, "error": _error(exc)}
    return {"ok": True, "version": str(getattr(module, "VERSION", ""))}


class Probe(DurableObject):
    """A SQLite-backed Durable Object: its `ctx.storage.sql`, as the kit's store uses it."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.wrapped = ctx.storage  # the SDK's wrapper of the JS storage object
        self.storage = getattr(self.wrapped, "_binding", self.wrapped)  # the JS object

    def _rows(self, cursor):
        rows = js.Array.from_(cursor.raw()).to_py()
        return [[None if v is jsnull else v for v in row] for row in rows]

    async def bind_value(self, text, via):
        sql = (self.wrapped if via == "sdk" else self.storage).sql
        sql.exec(BINDS_TABLE)
        sql.exec("DELETE FROM binds")
        try:
            sql.exec("INSERT INTO binds (v) VALUES (?)", _value(text))
        except Exception as exc:
            return json.dumps({"ok": False, "error": _error(exc)})
        rows = self._rows(self.storage.sql.exec("SELECT v, typeof(v) FROM binds"))
        return json.dumps({"ok": True, "rows": [[_cell(v), t] for v, t in rows]})

    async def run_sql(self, queries):
        """Each query one `sql.exec`, in order: the rows of each, up to the first error."""
        results = []
        for query in queries:
            try:
                results.append({"ok": True, "rows": self._rows(self.storage.sql.exec(query))})
            except Exception as exc:
                results.append({"ok": False, "error": _error(exc)})
                break
        return json.dumps(results)

    async def transaction(self):
        sql = self.storage.sql
        sql.exec("CREATE TABLE IF NOT EXISTS tx (n INTEGER)")
        sql.exec("DELETE FROM tx")

        def fails():
            sql.exec("INSERT INTO tx (n) VALUES (1)")
            raise ValueError("roll it back")

        def commits():
            sql.exec("INSERT INTO tx (n) VALUES (2)")
            return 7

        outcome = {}
        for name, body in (("fails", fails), ("commits", commits)):
            proxy = create_proxy(body)
            try:
                outcome[name] = {"returned": self.storage.transactionSync(proxy)}
            except Exception as exc:
                outcome[name] = {"error": _error(exc)}
            finally:
                proxy.destroy()
            outcome[name]["rows"] = self._rows(sql.exec("SELECT n FROM tx ORDER BY n"))
        return json.dumps(outcome)

    async def master(self):
        await self.storage.put("probe-key", 1)  # the KV API: its table is _cf_KV
        names = [r[0] for r in self._rows(self.storage.sql.exec("SELECT name FROM sqlite_master"))]
        try:
            kv = {"ok": True, "rows": self._rows(self.storage.sql.exec("SELECT key FROM _cf_KV"))}
        except Exception as exc:
            kv = {"ok": False, "error": _error(exc)}
        return json.dumps(
            {"names": names, "kv_get": await self.storage.get("probe-key"), "read_cf_kv": kv}
        )


class Default(WorkerEntrypoint):
    async def scheduled(self, *args, **kwargs):
        """Whatever workerd passes is accepted and recorded (the kit's handler must fit it)."""
        controller = args[0] if args else None
        call = {
            "positional": len(args),
            "keywords": sorted(kwargs),
            "cron": str(controller.cron) if controller is not None else None,
            "args": [_describe(a) for a in args],
        }
        db = self.env.DB
        await db.prepare(SCHEDULED_TABLE).run()
        record = db.prepare("INSERT INTO scheduled_calls (call) VALUES (?)")
        await record.bind(json.dumps(call)).run()

    async def fetch(self, request):
        url = urlparse(request.url)
        queries = parse_qs(url.query)
        query = {k: v[-1] for k, v in queries.items()}
        path = url.path
        if path == "/cwd":
            return _json({"at_import": CWD_AT_IMPORT, "now": os.getcwd()})
        if path == "/imports":
            return _json({name: _try_import(name) for name in ("pydantic", "pydantic.v1")})
        if path == "/scheduled":
            await self.env.DB.prepare(SCHEDULED_TABLE).run()
            rows = await self.env.DB.prepare("SELECT call FROM scheduled_calls ORDER BY n").raw()
            return _json([json.loads(row[0]) for row in rows])
        if path == "/d1/bind":
            return _json(await self.d1_bind(query["v"]))
        if path == "/d1/sql":
            return _json(await self.d1_sql(query["q"]))
        stub = self.env.PROBES.get(self.env.PROBES.idFromName("probe"))
        if path == "/do/bind":
            return _json(json.loads(await stub.bind_value(query["v"], query.get("via", "js"))))
        if path == "/do/sql":
            return _json(json.loads(await stub.run_sql(queries["q"])))
        if path == "/do/transaction":
            return _json(json.loads(await stub.transaction()))
        if path == "/do/master":
            return _json(json.loads(await stub.master()))
        return Response("not found", status=404)

    async def d1_bind(self, text):
        db = self.env.DB
        await db.prepare(BINDS_TABLE).run()
        await db.prepare("DELETE FROM binds").run()
        try:
            await db.prepare("INSERT INTO binds (v) VALUES (?)").bind(_value(text)).run()
        except Exception as exc:
            return {"ok": False, "error": _error(exc)}
        rows = await db.prepare("SELECT v, typeof(v) FROM binds").raw()
        return {"ok": True, "rows": [[_cell(v), str(t)] for v, t in rows]}

    async def d1_sql(self, query):
        try:
            rows = await self.env.DB.prepare(query).raw()
        except Exception as exc:
            return {"ok": False, "error": _error(exc)}
        return {"ok": True, "rows": [[_cell(v) for v in row] for row in rows]}
