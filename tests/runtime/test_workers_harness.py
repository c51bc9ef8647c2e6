"""The local runtime drives Python Workers and Durable Objects the way workerd does.

The classes are bound with `_local_runtime` (the harness's own module); the
code under test only uses the workers SDK, as on Cloudflare.
"""

import asyncio

import _local_runtime
import js
from pyodide.ffi import JsException
from workers import DurableObject, Request, Response, WorkerEntrypoint
from workers.rpc import _BindingWrapper

created = []
events = []


class Counter(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.count = 0
        created.append(self.ctx.id.toString())

    async def fetch(self, request):
        assert isinstance(request, Request)
        self.count += 1
        body = {"count": self.count, "id": self.ctx.id.toString(), "name": self.ctx.id.name}
        return Response.json(body | {"path": request.url})

    async def add(self, n, labels):
        self.count += n
        return {"count": self.count, "labels": labels, "nothing": None}

    async def slow(self, tag):
        events.append(f"{tag} start")
        await asyncio.sleep(0.02)
        events.append(f"{tag} end")

    async def fail(self):
        raise ValueError("boom in the object")

    async def locked(self, tag):
        async def critical():
            events.append(f"{tag} start")
            await asyncio.sleep(0.05)
            events.append(f"{tag} end")

        await self.ctx.blockConcurrencyWhile(critical)

    async def note(self, tag):
        events.append(tag)


class Default(WorkerEntrypoint):
    instances = 0

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        type(self).instances += 1

    async def fetch(self, request):
        assert isinstance(self.env.DB, _BindingWrapper)
        stub = self.env.COUNTERS.getByName(request.headers.get("x-name") or "default")
        reply = await stub.fetch("http://do/hit")
        data = await reply.json()
        return Response.json(data | {"worker_instances": type(self).instances})


class Background(WorkerEntrypoint):
    async def fetch(self, request):
        async def later():
            await asyncio.sleep(0.01)
            events.append("background done")

        self.ctx.waitUntil(later())
        return Response("accepted")


def _bind():
    created.clear()
    return _local_runtime.durableObjectNamespace("COUNTERS", Counter)


async def test_ids_are_deterministic_hex_with_names(env):
    _bind()
    ns = env.COUNTERS
    a, again, b = ns.idFromName("a"), ns.idFromName("a"), ns.idFromName("b")
    assert len(a.toString()) == 64
    assert int(a.toString(), 16) >= 0
    assert a.toString() == again.toString() != b.toString()
    assert a.name == "a"
    assert a.equals(again)
    assert ns.idFromString(a.toString()).toString() == a.toString()


async def test_one_live_instance_per_id(env):
    _bind()
    ns = env.COUNTERS
    first = await (await ns.get(ns.idFromName("x")).fetch("http://do/one")).json()
    second = await (await ns.getByName("x").fetch("http://do/two")).json()
    other = await (await ns.getByName("y").fetch("http://do/three")).json()
    assert (first["count"], second["count"], other["count"]) == (1, 2, 1)
    assert first["id"] == ns.idFromName("x").toString()
    assert first["name"] == "x"
    assert second["path"] == "http://do/two"
    assert len(created) == 2


async def test_rpc_converts_arguments_and_results(env):
    _bind()
    stub = env.COUNTERS.getByName("rpc")
    assert await stub.add(2, ["a", "b"]) == {"count": 2, "labels": ["a", "b"], "nothing": None}
    assert (await stub.add(3, []))["count"] == 5


async def test_rpc_errors_carry_the_python_traceback(env):
    _bind()
    error = None
    try:
        await env.COUNTERS.getByName("err").fail()
    except JsException as exc:
        error = str(exc)
    assert error is not None, "the error did not reach the caller"
    assert "ValueError: boom in the object" in error


async def test_requests_to_one_object_interleave_at_awaits(env):
    # As with workerd's input gates: awaiting I/O lets the next event in.
    _bind()
    stub = env.COUNTERS.getByName("slow")
    events.clear()
    await asyncio.gather(stub.slow("a"), stub.slow("b"))
    assert events == ["a start", "b start", "a end", "b end"]


async def test_worker_entrypoint_new_instance_per_request(env):
    _bind()
    worker = _local_runtime.workerEntrypoint(Default)
    Default.instances = 0
    headers = js.Headers.new([["x-name", "w"]])
    first = await Response(await worker.fetch(js.Request.new("http://w/", headers=headers))).json()
    second = await Response(await worker.fetch(js.Request.new("http://w/", headers=headers))).json()
    assert (first["count"], second["count"]) == (1, 2)
    assert (first["worker_instances"], second["worker_instances"]) == (1, 2)


async def test_block_concurrency_while_holds_back_other_events(env):
    _bind()
    stub = env.COUNTERS.getByName("gated")
    events.clear()
    locked = asyncio.ensure_future(stub.locked("a"))
    await asyncio.sleep(0.01)
    await stub.note("b")
    await locked
    assert events == ["a start", "a end", "b"]


async def test_wait_until_keeps_a_python_task_alive():
    worker = _local_runtime.workerEntrypoint(Background)
    events.clear()
    response = Response(await worker.fetch(js.Request.new("http://w/")))
    assert await response.text() == "accepted"
    assert events == []
    await _local_runtime.drain()
    assert events == ["background done"]
