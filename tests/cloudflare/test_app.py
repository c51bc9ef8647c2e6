"""The Worker's HTTP API (durable_agents.cloudflare.app) on CPython: auth, routing,
validation, dev stubs, and sessions run on D1 (the fake binding) with a scripted LLM.

The sessions run a small agent defined here (a safe read and a keyed send
through `make_deps(env, http)`), not any example: this is the kit's API.
The same code runs in the Worker; tests/cloudflare/test_dev_server*.py drive
it over HTTP inside the local runtime.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from tests.support.app_calls import Recorder

from durable_agents import (
    Agent,
    ConfigurationError,
    DurableAgentsError,
    LLMResponse,
    SessionConflictError,
    StoreError,
    ToolCall,
    ToolContext,
    tool,
)
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.app import (
    DEFAULT_MAX_BODY_BYTES,
    ERROR_STATUS,
    Command,
    LiveSession,
    Reply,
    error_for,
    handle_request,
    serve_session,
)
from durable_agents.cloudflare.commands import command_types
from durable_agents.cloudflare.routes import ROUTES
from durable_agents.cloudflare.session_object import HANDLERS
from durable_agents.llm.settings import setting
from durable_agents.stores.d1 import D1Store
from durable_agents.testing import ScriptedLLM
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ENV = {"API_TOKEN": TOKEN, "TEST_API_URL": "http://api.test/v1"}
SESSION_ID = "ab" * 32


# --- the agent the sessions run: what a user's src/agent.py would define ---


class ItemRef(BaseModel):
    id: str


class Note(BaseModel):
    text: str


@dataclass(frozen=True)
class Deps:
    url: str
    http: httpx.AsyncClient


@tool(safe_to_retry=True)
async def read_item(args: ItemRef, ctx: ToolContext) -> dict[str, Any]:
    """Read an item."""
    response = await ctx.deps.http.get(f"{ctx.deps.url}/items/{args.id}")
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


@tool
async def send_note(args: Note, ctx: ToolContext) -> dict[str, Any]:
    """Send a note (a side effect)."""
    response = await ctx.deps.http.post(
        f"{ctx.deps.url}/notes", json={"text": args.text},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )  # fmt: skip
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


AGENT = Agent("kit-test", "You read items and send notes.", [read_item, send_note])


def make_deps(env: Any, http: httpx.AsyncClient) -> Deps:
    url = setting(env, "TEST_API_URL")
    if url is None:
        raise ConfigurationError("TEST_API_URL is not set")
    return Deps(str(url), http)


async def call(
    method: str,
    path: str,
    body: bytes | Callable[[], Awaitable[bytes]] = b"",
    *,
    headers: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    dispatch: Any = None,
) -> Reply:
    return await handle_request(
        method,
        path,
        AUTH if headers is None else headers,
        body,
        env=ENV if env is None else env,
        dispatch=dispatch or Recorder(),
    )


def code(reply: Reply) -> str:
    error = reply.body["error"]
    assert set(error) == {"code", "message"}
    assert error["message"]
    return str(error["code"])


# --- auth ---


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": ""},
        {"authorization": "Bearer"},
        {"authorization": "Bearer wrong"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": TOKEN},
    ],
)
async def test_requests_without_the_token_get_401_and_reach_no_session(
    headers: dict[str, str],
) -> None:
    recorder = Recorder()
    reply = await call("POST", "/sessions/a/messages", b'{"message": "hi"}', headers=headers,
                       dispatch=recorder)  # fmt: skip
    assert reply.status == 401
    assert code(reply) == "unauthorized"
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert recorder.commands == []


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_the_bearer_scheme_is_case_insensitive(scheme: str) -> None:
    reply = await call("GET", "/sessions/a", headers={"authorization": f"{scheme} {TOKEN}"})
    assert reply.status == 200


@pytest.mark.parametrize(
    "authorization",
    [
        f"Bearer {TOKEN}\xa0",  # str.strip() would drop the no-break space
        f"Bearer \xa0{TOKEN}",
        f"Bearer {TOKEN}\u2003",
        f"\u3000Bearer {TOKEN}",
        f"Bearer {TOKEN} ",
        f" Bearer {TOKEN}",
        f"Bearer  {TOKEN}",
        f"Bearer\t{TOKEN}",
        f"Bearer {TOKEN}\t",
        f"Bearer {TOKEN}\n",
        f"Bearer\xa0{TOKEN}",
        f"Bearer {TOKEN[:-1]}\u0275",  # a non-ASCII token of the same length
        "Bearer t\u00f6k\u00e9n",
        "Bearer \ud800",  # a lone surrogate: not encodable as UTF-8
        "B\u00e9arer " + TOKEN,
    ],
)
async def test_only_bearer_one_space_and_the_exact_token_is_accepted(authorization: str) -> None:
    recorder = Recorder()
    reply = await call("GET", "/sessions/a", headers={"authorization": authorization},
                       dispatch=recorder)  # fmt: skip
    assert reply.status == 401, repr(authorization)
    assert code(reply) == "unauthorized"
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert recorder.commands == []


async def test_without_api_token_every_request_is_refused() -> None:
    recorder = Recorder()
    for env in ({}, {"API_TOKEN": ""}, {"API_TOKEN": "   "}):
        reply = await call("GET", "/sessions/a", env=env, dispatch=recorder)
        assert reply.status == 500
        assert code(reply) == "configuration"
        assert "API_TOKEN" in reply.body["error"]["message"]
    assert recorder.commands == []


async def test_auth_comes_before_routing() -> None:
    reply = await call("GET", "/nowhere", headers={})
    assert reply.status == 401


# --- routing ---


@pytest.mark.parametrize(
    "path",
    ["/", "/sessions/a/", "/sessions/a/other", "/sessions/a/messages/x", "/sessionsx",
     "/session/a", "//sessions/a"],
)  # fmt: skip
async def test_unknown_paths_are_404(path: str) -> None:
    reply = await call("GET", path)
    assert reply.status == 404
    assert code(reply) == "not-found"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/sessions/a", "GET, DELETE"),
        ("PUT", "/sessions/a", "GET, DELETE"),
        ("GET", "/sessions/a/messages", "POST"),
        ("PUT", "/sessions/a/messages", "POST"),
        ("GET", "/sessions/a/resume", "POST"),
        ("HEAD", "/sessions/a/resume", "POST"),
    ],
)
async def test_wrong_methods_are_405_with_allow(method: str, path: str, allowed: str) -> None:
    recorder = Recorder()
    reply = await call(method, path, b'{"message": "hi"}', dispatch=recorder)
    assert reply.status == 405
    assert code(reply) == "method-not-allowed"
    assert reply.headers["Allow"] == allowed
    assert recorder.commands == []


@pytest.mark.parametrize(
    "name", ["a.b", "a%20b", "x" * 65, "caf\u00e9", "a+b", "..", "a:b", "%2e%2e"]
)
async def test_bad_session_names_are_400(name: str) -> None:
    recorder = Recorder()
    for method, path in (("GET", f"/sessions/{name}"), ("POST", f"/sessions/{name}/resume")):
        reply = await call(method, path, dispatch=recorder)
        assert reply.status == 400
        assert code(reply) == "invalid-session-name"
    assert recorder.commands == []


@pytest.mark.parametrize("name", ["a", "A-z_09", "x" * 64, "-", "_"])
async def test_good_session_names_reach_their_object(name: str) -> None:
    recorder = Recorder()
    reply = await call("GET", f"/sessions/{name}", dispatch=recorder)
    assert reply.status == 200
    assert recorder.commands == [(name, Command("history", name=name))]


# --- bodies ---


@pytest.mark.parametrize(
    ("body", "status", "error_code"),
    [
        (b"", 400, "invalid-json"),
        (b"   ", 400, "invalid-json"),
        (b"{", 400, "invalid-json"),
        (b"{'message': 'hi'}", 400, "invalid-json"),
        (b'{"message": "\xff"}', 400, "invalid-json"),
        (b"[" * 50_000 + b"]" * 50_000, 413, "body-too-large"),
        (b"[" * 30_000 + b"]" * 30_000, 400, "invalid-json"),
        (b'"hi"', 422, "invalid-body"),
        (b'["hi"]', 422, "invalid-body"),
        (b"null", 422, "invalid-body"),
        (b"{}", 422, "invalid-body"),
        (b'{"message": null}', 422, "invalid-body"),
        (b'{"message": 42}', 422, "invalid-body"),
        (b'{"message": ["hi"]}', 422, "invalid-body"),
        (b'{"message": {"text": "hi"}}', 422, "invalid-body"),
        (b'{"message": true}', 422, "invalid-body"),
        (b'{"message": ""}', 422, "invalid-body"),
        (b'{"message": " \\n\\t "}', 422, "invalid-body"),
        (b'{"message": "hi", "extra": 1}', 422, "invalid-body"),
        (b'{"text": "hi"}', 422, "invalid-body"),
    ],
)
async def test_malformed_message_bodies_are_4xx_and_reach_no_session(
    body: bytes, status: int, error_code: str
) -> None:
    recorder = Recorder()
    reply = await call("POST", "/sessions/a/messages", body, dispatch=recorder)
    assert (reply.status, code(reply)) == (status, error_code)
    assert recorder.commands == []


async def test_a_valid_message_reaches_its_object_as_sent() -> None:
    recorder = Recorder()
    text = "note on item 42 \u2603"
    body = json.dumps({"message": text}).encode()
    reply = await call("POST", "/sessions/team-a/messages", body, dispatch=recorder)
    assert reply.status == 200
    assert recorder.commands == [("team-a", Command("message", text, name="team-a"))]


async def test_an_idempotency_key_travels_with_the_message() -> None:
    recorder = Recorder()
    body = json.dumps({"message": "hi"}).encode()
    reply = await call("POST", "/sessions/a/messages", body, dispatch=recorder,
                       headers={**AUTH, "idempotency-key": "req-42"})  # fmt: skip
    assert reply.status == 200
    assert recorder.commands == [("a", Command("message", "hi", "req-42", name="a"))]
    for bad in ("", "x" * 256, "has space", "caf\u00e9"):
        bad_reply = await call("POST", "/sessions/a/messages", body, dispatch=recorder,
                               headers={**AUTH, "idempotency-key": bad})  # fmt: skip
        assert (bad_reply.status, code(bad_reply)) == (400, "invalid-request")
    assert len(recorder.commands) == 1


async def test_a_retried_request_with_its_key_runs_no_second_turn(store: D1Store) -> None:
    posts: list[httpx.Request] = []
    command = Command("message", "note 42", "req-1")
    first = await serve(command, store, ScriptedLLM(two_tools_script()), client=api_http(posts))
    retry = await serve(command, store, ScriptedLLM([]), client=api_http(posts))
    assert retry.status == 200
    assert retry.body["response"] == first.body["response"]
    assert retry.body["steps"] == 0
    assert len(posts) == 1
    reused = await serve(Command("message", "other text", "req-1"), store, ScriptedLLM([]))
    assert (reused.status, code(reused)) == (422, "request-key-reused")


async def test_oversized_bodies_are_413_by_size_and_by_declared_length() -> None:
    recorder = Recorder()
    text = "x" * DEFAULT_MAX_BODY_BYTES
    reply = await call("POST", "/sessions/a/messages", json.dumps({"message": text}).encode(),
                       dispatch=recorder)  # fmt: skip
    assert (reply.status, code(reply)) == (413, "body-too-large")

    read: list[bool] = []

    async def reader() -> bytes:
        read.append(True)
        return b'{"message": "hi"}'

    headers = {**AUTH, "content-length": str(DEFAULT_MAX_BODY_BYTES + 1)}
    reply = await call("POST", "/sessions/a/messages", reader, headers=headers, dispatch=recorder)
    assert (reply.status, code(reply)) == (413, "body-too-large")
    assert read == [], "the body was read although its declared length is over the limit"
    bad_length = {**AUTH, "content-length": "ten"}
    reply = await call("POST", "/sessions/a/messages", b"{}", headers=bad_length)
    assert reply.status == 400
    assert recorder.commands == []


async def test_the_body_limit_is_configurable() -> None:
    env = {**ENV, "MAX_BODY_BYTES": "20"}
    small = await call("POST", "/sessions/a/messages", b'{"message": "hi"}', env=env)
    assert small.status == 200
    big = await call("POST", "/sessions/a/messages", b'{"message": "hello there"}', env=env)
    assert big.status == 413
    for bad in ("0", "-5", "lots"):
        reply = await call("GET", "/sessions/a", env={**ENV, "MAX_BODY_BYTES": bad})
        assert (reply.status, code(reply)) == (500, "configuration")


async def test_a_body_reader_is_read_when_the_length_is_fine() -> None:
    recorder = Recorder()

    async def reader() -> bytes:
        return b'{"message": "hi"}'

    reply = await call("POST", "/sessions/a/messages", reader, dispatch=recorder)
    assert reply.status == 200
    assert recorder.commands == [("a", Command("message", "hi", name="a"))]


@pytest.mark.parametrize("body", [b"", b"{}", b" \n"])
async def test_resume_takes_no_body_or_an_empty_object(body: bytes) -> None:
    recorder = Recorder()
    reply = await call("POST", "/sessions/a/resume", body, dispatch=recorder)
    assert reply.status == 200
    assert recorder.commands == [("a", Command("resume", name="a"))]


@pytest.mark.parametrize(
    ("body", "status"), [(b'{"message": "hi"}', 422), (b"[]", 422), (b"{", 400)]
)
async def test_resume_rejects_any_other_body(body: bytes, status: int) -> None:
    recorder = Recorder()
    reply = await call("POST", "/sessions/a/resume", body, dispatch=recorder)
    assert reply.status == status
    assert recorder.commands == []


async def test_a_failing_session_object_is_a_json_500() -> None:
    async def broken(name: str, command: Command) -> Reply:
        raise OSError("the object is unreachable")

    reply = await call("GET", "/sessions/a", dispatch=broken)
    assert (reply.status, code(reply)) == (500, "internal")
    assert "OSError" in reply.body["error"]["message"]


# --- the command between the Worker and the object ---


@pytest.mark.parametrize(
    "command",
    [Command("message", "hi \u2603"), Command("message", "hi", "key-1"), Command("resume"),
     Command("history")],
)  # fmt: skip
def test_commands_round_trip(command: Command) -> None:
    assert Command.from_json(command.to_json()) == command


@pytest.mark.parametrize(
    "text",
    ["{", "[]", '{"action": "message"}', '{"action": "message", "message": ""}',
     '{"action": "resume", "message": "x"}', '{"action": "drop"}',
     '{"action": "history", "name": "a b"}',
     '{"action": "message", "message": "m", "request_key": ""}',
     '{"action": "resume", "request_key": "k"}'],
)  # fmt: skip
def test_anything_else_is_not_a_command(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - json errors are ValueErrors too
        Command.from_json(text)


def test_every_command_has_one_handler_in_the_object() -> None:
    assert set(command_types()) == set(HANDLERS)


def test_every_route_is_one_row_of_the_table() -> None:
    rows = [(route.method, route.path) for route in ROUTES]
    assert len(rows) == len(set(rows))
    assert ("POST", "/sessions/{name}/cancel") in rows


# --- sessions: the Durable Object's half, on the fake D1 binding ---


def api_http(posts: list[httpx.Request]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and str(request.url) == "http://api.test/v1/items/42":
            return httpx.Response(200, json={"id": "42", "title": "Login fails"})
        if request.method == "POST" and str(request.url) == "http://api.test/v1/notes":
            posts.append(request)
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(404)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def two_tools_script() -> list[LLMResponse]:
    return [
        LLMResponse("Looking.", [ToolCall("c1", "read_item", {"id": "42"})]),
        LLMResponse("Sending.", [ToolCall("c2", "send_note", {"text": "42 fails"})]),
        LLMResponse("Sent a note on 42."),
    ]


@pytest.fixture
async def store() -> D1Store:
    store = d1_store(FakeD1Database())
    await store.create_tables()
    return store


async def serve(
    command: Command, store: Any, llm: Any = None, *, live: LiveSession | None = None,
    client: httpx.AsyncClient | None = None, env: dict[str, str] | None = None,
) -> Reply:  # fmt: skip
    return await serve_session(
        command,
        session_id=SESSION_ID,
        store=store,
        env=ENV if env is None else env,
        live=live or LiveSession(),
        agent=AGENT,
        make_deps=make_deps,
        llm=llm,
        http_client=client or api_http([]),
    )


async def test_a_turn_runs_the_agents_tools_and_returns_the_reply(store: D1Store) -> None:
    posts: list[httpx.Request] = []
    llm = ScriptedLLM(two_tools_script())
    reply = await serve(Command("message", "note 42"), store, llm, client=api_http(posts))
    assert reply.status == 200
    assert reply.body == {
        "session_id": SESSION_ID,
        "status": "complete",
        "response": "Sent a note on 42.",
        "steps": 3,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    assert len(posts) == 1
    assert posts[0].headers["idempotency-key"].startswith("da-")
    history = await serve(Command("history"), store)
    assert history.status == 200
    assert history.body["session_id"] == SESSION_ID
    roles = [m["role"] for m in history.body["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    again = await serve(Command("resume"), store, ScriptedLLM([]))
    assert (again.status, again.body["response"], again.body["steps"]) == (
        200,
        "Sent a note on 42.",
        0,
    )


async def test_a_session_without_history_is_404_for_reads_and_resumes(store: D1Store) -> None:
    for command in (Command("history"), Command("resume")):
        reply = await serve(command, store, ScriptedLLM([]))
        assert (reply.status, code(reply)) == (404, "session-not-found")
    assert await store.load_messages(SESSION_ID) == []


async def test_an_llm_failure_is_a_502_and_leaves_the_session_resumable(store: D1Store) -> None:
    llm = ScriptedLLM([RuntimeError("provider down"), LLMResponse("Back.")])
    reply = await serve(Command("message", "hi"), store, llm)
    assert reply.status == 502
    assert reply.body["status"] == "error"
    assert reply.body["error"]["code"] == "llm-error"
    assert "provider down" in reply.body["error"]["message"]
    resumed = await serve(Command("message", "hi again"), store, llm)
    assert (resumed.status, resumed.body["response"]) == (200, "Back.")


async def test_configuration_errors_are_500_before_anything_is_written(store: D1Store) -> None:
    no_url = {"API_TOKEN": TOKEN}
    reply = await serve(Command("message", "hi"), store, ScriptedLLM([]), env=no_url)
    assert (reply.status, code(reply)) == (500, "configuration")
    assert "TEST_API_URL" in reply.body["error"]["message"]
    bad_llm = {**ENV, "LLM_PROVIDER": "nonsense"}
    reply = await serve_session(
        Command("message", "hi"), session_id=SESSION_ID, store=store, env=bad_llm,
        live=LiveSession(), agent=AGENT, make_deps=make_deps,
    )  # fmt: skip
    assert (reply.status, code(reply)) == (500, "configuration")
    assert "LLM_PROVIDER" in reply.body["error"]["message"]
    assert await store.load_messages(SESSION_ID) == []


async def test_make_llm_builds_each_turns_model_from_the_env(store: D1Store) -> None:
    seen: list[Any] = []

    def make_llm(env: Any) -> ScriptedLLM:
        seen.append(env)
        return ScriptedLLM([LLMResponse(f"model for {env['LLM_MODEL']}")])

    env = {**ENV, "LLM_MODEL": "m1"}
    reply = await serve_session(
        Command("message", "hi"), session_id=SESSION_ID, store=store, env=env,
        live=LiveSession(), agent=AGENT, make_deps=make_deps, make_llm=make_llm,
    )  # fmt: skip
    assert (reply.status, reply.body["response"]) == (200, "model for m1")
    assert seen == [env]


async def test_without_make_llm_no_settings_run_the_offline_test_model(store: D1Store) -> None:
    posts: list[httpx.Request] = []
    reply = await serve_session(
        Command("message", "hi"), session_id=SESSION_ID, store=store, env=ENV,
        live=LiveSession(), agent=AGENT, make_deps=make_deps, http_client=api_http(posts),
    )  # fmt: skip
    assert reply.status == 200, reply.body
    assert reply.body["status"] == "complete"
    history = await store.load_messages(SESSION_ID)
    called = sorted(c.name for m in history for c in m.tool_calls)
    assert called == ["read_item", "send_note"]
    assert len(posts) == 1


async def test_a_message_over_the_agents_limit_is_413(store: D1Store) -> None:
    agent = Agent("tiny", "", max_message_bytes=10)
    reply = await serve_session(
        Command("message", "x" * 11), session_id=SESSION_ID, store=store, env=ENV,
        live=LiveSession(), agent=agent, make_deps=make_deps, llm=ScriptedLLM([]),
    )  # fmt: skip
    assert (reply.status, code(reply)) == (413, "message-too-large")


class FailingStore:
    """A store whose writes fail with `error`; reads see an empty history."""

    durable = True

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def load_messages(self, session_id: str, **page: Any) -> list[Any]:
        return []

    async def load_context(self, session_id: str) -> tuple[int, list[Any]]:
        return 0, []

    async def get_session(self, session_id: str) -> None:
        return None

    async def append_messages_atomic(self, *args: Any, **kwargs: Any) -> int:
        raise self.error


@pytest.mark.parametrize(
    ("error", "status", "error_code"),
    [
        (SessionConflictError(SESSION_ID, 0, "taken"), 409, "session-conflict"),
        (StoreError("D1 is unreachable"), 503, StoreError.code),
        (KeyError("bug"), 500, "internal"),
    ],
)
async def test_store_failures_map_to_statuses(
    error: Exception, status: int, error_code: str
) -> None:
    reply = await serve(Command("message", "hi"), FailingStore(error),
                        ScriptedLLM([LLMResponse("Hello.")]))  # fmt: skip
    assert (reply.status, code(reply)) == (status, error_code)


async def test_one_turn_at_a_time_per_session(store: D1Store) -> None:
    """Two messages sent at once: the second waits for the first turn, then runs
    on its history; no conflict, no interleaving."""
    first_started, release_first = asyncio.Event(), asyncio.Event()
    seen: list[list[str]] = []

    async def slow_first(messages: list[Any], tools: list[Any]) -> LLMResponse:
        seen.append([m.content for m in messages if m.role == "user"])
        first_started.set()
        await release_first.wait()
        return LLMResponse("first done")

    def second(messages: list[Any], tools: list[Any]) -> LLMResponse:
        seen.append([m.content for m in messages if m.role == "user"])
        return LLMResponse("second done")

    llm = ScriptedLLM([slow_first, second])
    live = LiveSession()
    one = asyncio.create_task(serve(Command("message", "one"), store, llm, live=live))
    await first_started.wait()
    two = asyncio.create_task(serve(Command("message", "two"), store, llm, live=live))
    await asyncio.sleep(0.01)
    assert not two.done()
    release_first.set()
    replies = await asyncio.gather(one, two)
    assert [r.status for r in replies] == [200, 200]
    assert seen == [["one"], ["one", "two"]]


async def test_reads_do_not_wait_for_a_turn(store: D1Store) -> None:
    live = LiveSession()
    first = await serve(Command("message", "hi"), store, ScriptedLLM([LLMResponse("hey")]))
    assert first.status == 200
    async with live.lock:  # a turn in progress
        reply = await asyncio.wait_for(serve(Command("history"), store, live=live), 1)
    assert reply.status == 200


# --- the whole API on CPython: Worker half + object half ---


async def test_end_to_end_on_cpython(store: D1Store) -> None:
    posts: list[httpx.Request] = []
    llm = ScriptedLLM(two_tools_script())
    lives: dict[str, LiveSession] = {}

    async def to_object(name: str, command: Command) -> Reply:
        # Stands in for the Durable Object: name -> one id, one lock.
        session_id = f"{name:0>64}"
        return await serve_session(
            Command.from_json(command.to_json()), session_id=session_id, store=store, env=ENV,
            live=lives.setdefault(name, LiveSession()), agent=AGENT, make_deps=make_deps,
            llm=llm, http_client=api_http(posts),
        )  # fmt: skip

    sent = await call("POST", "/sessions/s1/messages", b'{"message": "note 42"}',
                      dispatch=to_object)  # fmt: skip
    assert (sent.status, sent.body["status"], sent.body["response"]) == (
        200, "complete", "Sent a note on 42.",
    )  # fmt: skip
    read = await call("GET", "/sessions/s1", dispatch=to_object)
    assert len(read.body["messages"]) == 6
    missing = await call("GET", "/sessions/s2", dispatch=to_object)
    assert missing.status == 404
    assert len(posts) == 1


# --- errors: each answered with its own code, at its class's status ---


@pytest.mark.parametrize("cls", sorted(ERROR_STATUS, key=lambda c: c.__name__))
def test_every_mapped_error_answers_with_its_own_code(cls: type[DurableAgentsError]) -> None:
    error = cls.__new__(cls)
    Exception.__init__(error, "what happened")
    reply = error_for(error)
    assert (reply.status, code(reply)) == (ERROR_STATUS[cls], cls.code)
    assert reply.body["error"]["message"] == "what happened"


def test_an_unmapped_error_takes_its_nearest_mapped_base() -> None:
    class Special(StoreError):
        code = "special-store"

    reply = error_for(Special("gone"))
    assert (reply.status, code(reply)) == (503, "special-store")
    assert error_for(DurableAgentsError("?")).status == 500


# --- dev stubs: /__dev/<NAME>/... while DEV_STUBS is "on" ---


def recording_stub(calls: list[tuple[str, str, bytes, dict[str, str]]]) -> Any:
    def stub(method: str, path: str, body: bytes, headers: Any) -> tuple[int, Any]:
        calls.append((method, path, body, dict(headers)))
        return 201, [{"ok": True}]

    return stub


async def test_a_dev_stub_answers_its_settings_path_without_auth() -> None:
    calls: list[tuple[str, str, bytes, dict[str, str]]] = []
    stubs = {"TEST_API_URL": recording_stub(calls)}
    recorder = Recorder()
    env = {**ENV, "DEV_STUBS": "on"}
    headers = {"idempotency-key": "k1"}
    for path, query, seen in (
        ("/__dev/TEST_API_URL/items/7", "", "/items/7"),
        ("/__dev/TEST_API_URL", "", "/"), ("/__dev/TEST_API_URL/", "", "/"),
        ("/__dev/TEST_API_URL/slots", "date=2026-12-03&n=2", "/slots?date=2026-12-03&n=2"),
        ("/__dev/TEST_API_URL", "q=%C3%A9", "/?q=%C3%A9"),  # as sent: still percent-encoded
    ):  # fmt: skip
        reply = await handle_request(
            "post", path, headers, b'{"a": 1}', env=env, dispatch=recorder, dev_stubs=stubs,
            query=query,
        )  # fmt: skip
        assert (reply.status, reply.body) == (201, [{"ok": True}])
        assert calls[-1] == ("POST", seen, b'{"a": 1}', headers)
    assert recorder.commands == []


async def test_dev_stubs_are_not_served_unless_dev_stubs_is_on() -> None:
    calls: list[tuple[str, str, bytes, dict[str, str]]] = []
    stubs = {"TEST_API_URL": recording_stub(calls)}
    for env in (ENV, {**ENV, "DEV_STUBS": "off"}, {**ENV, "DEV_STUBS": "1"}):
        anonymous = await handle_request(
            "GET", "/__dev/TEST_API_URL/x", {}, b"", env=env, dispatch=Recorder(), dev_stubs=stubs
        )
        assert anonymous.status == 401
        authorized = await handle_request(
            "GET", "/__dev/TEST_API_URL/x", AUTH, b"", env=env, dispatch=Recorder(),
            dev_stubs=stubs,
        )  # fmt: skip
        assert (authorized.status, code(authorized)) == (404, "not-found")
    assert calls == []


async def test_a_dev_stub_that_is_missing_fails_or_is_async() -> None:
    env = {**ENV, "DEV_STUBS": "on"}

    def broken(method: str, path: str, body: bytes, headers: Any) -> tuple[int, Any]:
        raise KeyError("bug")

    async def slow(method: str, path: str, body: bytes, headers: Any) -> tuple[int, Any]:
        await asyncio.sleep(0)
        return 200, {"path": path}

    def not_a_reply(method: str, path: str, body: bytes, headers: Any) -> Any:
        return {"ok": True}

    stubs = {"BROKEN": broken, "SLOW": slow, "ODD": not_a_reply}

    async def get(path: str, body: bytes = b"") -> Reply:
        return await handle_request(
            "GET", path, {}, body, env=env, dispatch=Recorder(), dev_stubs=stubs
        )

    missing = await get("/__dev/NOPE/x")
    assert (missing.status, code(missing)) == (404, "not-found")
    assert "BROKEN" in missing.body["error"]["message"]
    assert (await get("/__dev/SLOW/a/b")).body == {"path": "/a/b"}
    for path in ("/__dev/BROKEN/", "/__dev/ODD/"):
        failed = await get(path)
        assert (failed.status, code(failed)) == (500, "internal")
    deep = await get("/__dev/SLOW/", b"[" * 5000 + b"]" * 5000)
    assert (deep.status, code(deep)) == (400, "invalid-json")
