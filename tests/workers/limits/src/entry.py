"""A Worker that makes N subrequests in one invocation (test fixture for
tests/cloudflare/test_dev_server_limits.py). Every answer is JSON: how many calls succeeded
and the first failure, as `#i: Type: message`.

    GET /fetch?n=&target=&mode=   n fetches of target (mode: seq, gather: all at once, js:
                                  js.fetch, as the kit's FetchTransport; bound: the `fetch`
                                  of `from js import fetch` at import, as Cloudflare's
                                  examples write it; else workers.fetch)
    GET /d1?n=&how=               n D1 queries (how: run, first, all, raw; batch: n batches
                                  of two statements)
    GET /do?n=&target=&calls=     `calls` requests to a Durable Object, each making n fetches
"""

import asyncio
import json
from urllib.parse import parse_qs, urlparse

import js
from js import fetch as bound_fetch
from workers import DurableObject, Response, WorkerEntrypoint, fetch


def _error(i, exc):
    return f"#{i + 1}: {type(exc).__name__}: {exc}"


async def fetches(n, target, mode):
    ok, errors = 0, []

    async def one(i):
        nonlocal ok
        try:
            if mode == "js":
                response = await js.fetch(target)
                await response.text()
            elif mode == "bound":
                response = await bound_fetch(target)
                await response.text()
            else:
                response = await fetch(target)
                await response.text()
            ok += 1
        except Exception as exc:
            errors.append(_error(i, exc))

    if mode == "gather":
        await asyncio.gather(*(one(i) for i in range(n)))
    else:
        for i in range(n):
            await one(i)
    return {"ok": ok, "errors": len(errors), "first_error": errors[0] if errors else None}


class Fetcher(DurableObject):
    async def fetch(self, request):
        query = {k: v[-1] for k, v in parse_qs(urlparse(request.url).query).items()}
        result = await fetches(int(query["n"]), query["target"], query.get("mode", "seq"))
        return Response(json.dumps(result), headers={"content-type": "application/json"})


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlparse(request.url)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        n = int(query.get("n", "60"))
        if url.path == "/fetch":
            result = await fetches(n, query["target"], query.get("mode", "seq"))
        elif url.path == "/d1":
            result = await self.queries(n, query.get("how", "run"))
        elif url.path == "/do":
            stub = self.env.FETCHERS.getByName("probe")
            result = []
            for _ in range(int(query.get("calls", "2"))):
                target = js.encodeURIComponent(query["target"])
                answer = await stub.fetch(f"https://do.internal/?n={n}&target={target}")
                result.append(await answer.json())
        else:
            return Response("not found", status=404)
        return Response(json.dumps(result), headers={"content-type": "application/json"})

    async def queries(self, n, how):
        db = self.env.DB
        ok, errors = 0, []
        for i in range(n):
            try:
                if how == "batch":
                    await db.batch([db.prepare("SELECT 1"), db.prepare("SELECT ?").bind(i)])
                else:
                    await getattr(db.prepare("SELECT ?").bind(i), how)()
                ok += 1
            except Exception as exc:
                errors.append(_error(i, exc))
        return {"ok": ok, "errors": len(errors), "first_error": errors[0] if errors else None}
