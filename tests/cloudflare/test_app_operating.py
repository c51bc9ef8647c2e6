"""Operating sessions over the Worker's API on CPython (fake D1): the listing by cursor, deleting
a session (also under a running turn), the timeline page, retention, and the Worker's spend limit.
test_dev_server_operating.py does the same over HTTP in the local runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    Message,
    SessionConflictError,
    TextDelta,
    ToolCall,
    ToolContext,
    ToolSpec,
    Usage,
    agent_tool,
    tool,
)
from durable_agents.agent_tools import child_session_name
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.app import (
    Command,
    LiveSession,
    Reply,
    handle_request,
    run_retention,
    serve_session,
    with_budget,
)
from durable_agents.messages import ParentCall
from durable_agents.stores.d1 import D1Store
from durable_agents.testing.conformance import ticking_clock
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "master-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ENV: dict[str, str] = {"API_TOKEN": TOKEN}


class NoteArgs(BaseModel):
    text: str


@tool
async def send_note(args: NoteArgs, ctx: ToolContext) -> str:
    """Send a note (a side effect)."""
    return "sent"


AGENT = Agent("operator-test", "You send notes.", [send_note])


class Model:
    """One note per turn, then a reply; 100 input + 20 output tokens per answer. With
    `gate` set, each call waits for it (a turn in progress)."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if messages[-1].role == "tool":
            return LLMResponse("Done <b>bold</b>.", usage=Usage(100, 20))
        call = ToolCall("", "send_note", {"text": messages[-1].content})
        return LLMResponse("Sending.", [call], Usage(100, 20))

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[TextDelta | LLMResponse]:
        yield await self.chat(messages, tools)


class Worker:
    """The Worker and its Durable Objects, in one process: name -> one object id."""

    def __init__(self, store: D1Store, env: dict[str, str] | None = None) -> None:
        self.store, self.model, self.env = store, Model(), {**ENV, **(env or {})}
        self.lives: dict[str, LiveSession] = {}

    async def dispatch(self, name: str, command: Command) -> Reply:
        return await serve_session(
            Command.from_json(command.to_json()), session_id=f"id-{name}", store=self.store,
            env=self.env, live=self.lives.setdefault(name, LiveSession()), agent=AGENT,
            make_deps=lambda env, http: None, llm=self.model,
        )  # fmt: skip

    async def __call__(self, method: str, path: str, body: Any = None, query: str = "") -> Reply:
        raw = b"" if body is None else json.dumps(body).encode()
        return await handle_request(
            method, path, AUTH, raw, env=self.env, dispatch=self.dispatch, query=query,
            sessions=lambda: self.store,
        )  # fmt: skip


@pytest.fixture
async def store() -> D1Store:
    store = d1_store(FakeD1Database(), clock=ticking_clock(start=1_800_000_000.0, step=1.0))
    await store.create_tables()
    return store


async def test_the_listing_pages_newest_first_with_names_and_usage(store: D1Store) -> None:
    worker = Worker(store)
    for name in ("first", "second", "third"):
        assert (await worker("POST", f"/sessions/{name}/messages", {"message": "hi"})).status == 200

    page = await worker("GET", "/sessions", query="limit=2")
    assert page.status == 200, page.body
    rows = page.body["sessions"]
    assert [r["name"] for r in rows] == ["third", "second"]
    assert rows[0]["session_id"] == "id-third"
    assert rows[0]["agent"] == "operator-test"
    assert rows[0]["message_count"] == 4
    assert rows[0]["usage"] == {"input_tokens": 200, "output_tokens": 40}
    assert rows[0]["created_at"].endswith("Z")
    assert rows[0]["created_at"] <= rows[0]["updated_at"]
    rest = await worker("GET", "/sessions", query=f"limit=2&cursor={page.body['next_cursor']}")
    assert [r["name"] for r in rest.body["sessions"]] == ["first"]
    assert rest.body["next_cursor"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=201", "limit=x", "cursor=not-a-cursor"])
async def test_a_bad_limit_or_cursor_is_a_400(store: D1Store, query: str) -> None:
    reply = await Worker(store)("GET", "/sessions", query=query)
    assert reply.status == 400, reply.body
    assert reply.body["error"]["code"] in ("invalid-request", "invalid-cursor")


async def test_delete_removes_the_session_then_it_reads_as_404(store: D1Store) -> None:
    worker = Worker(store)
    await worker("POST", "/sessions/gone/messages", {"message": "hi"})
    await worker("POST", "/sessions/kept/messages", {"message": "hi"})
    deleted = await worker("DELETE", "/sessions/gone")
    assert (deleted.status, deleted.body) == (200, {"session_id": "id-gone", "deleted": True})
    assert (await worker("GET", "/sessions/gone")).status == 404
    assert (await worker("GET", "/sessions/gone/view")).status == 404
    assert (await worker("DELETE", "/sessions/gone")).status == 404
    listed = await worker("GET", "/sessions")
    assert [r["name"] for r in listed.body["sessions"]] == ["kept"]


async def test_a_turn_running_when_its_session_is_deleted_ends_with_a_conflict(
    store: D1Store,
) -> None:
    worker = Worker(store)
    await worker("POST", "/sessions/busy/messages", {"message": "one"})
    worker.model.gate = asyncio.Event()
    worker.model.started.clear()
    turn = asyncio.ensure_future(worker("POST", "/sessions/busy/messages", {"message": "two"}))
    await worker.model.started.wait()
    assert (await worker("DELETE", "/sessions/busy")).status == 200
    worker.model.gate.set()
    reply = await turn
    assert reply.status == 409
    assert reply.body["error"]["code"] == SessionConflictError.code
    assert await store.load_messages("id-busy") == []  # nothing half-deleted, nothing re-added
    assert await store.get_session("id-busy") is None


async def test_the_view_is_the_escaped_timeline_page(store: D1Store) -> None:
    worker = Worker(store)
    await worker("POST", "/sessions/shown/messages", {"message": "<script>alert(1)</script>"})
    page = await worker("GET", "/sessions/shown/view")
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.text is not None
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "shown" in page.text


class SupportWorker(Worker):
    """The Worker serving an agent with an agent tool (of the served agent `refunds`)."""

    async def dispatch(self, name: str, command: Command) -> Reply:
        return await serve_session(
            Command.from_json(command.to_json()), session_id=f"id-{name}", store=self.store,
            env=self.env, live=self.lives.setdefault(name, LiveSession()), agent=SUPPORT,
            make_deps=lambda env, http: None, llm=self.model,
        )  # fmt: skip


SUPPORT = Agent("support", "You help.", [agent_tool("refunds", description="Refunds orders.")])


async def test_the_view_links_a_call_and_its_child_session_both_ways(store: D1Store) -> None:
    call = ToolCall("call_1", "refunds", {"message": "refund 42"})
    await store.append_messages_atomic(
        "id-ticket", 0,
        [Message.user("refund 42"), Message.assistant("", [call]),
         Message.tool_result(call, "refunded"), Message.assistant("Done.")],
        agent_name="support", session_name="ticket",
    )  # fmt: skip
    child = child_session_name("id-ticket", "call_1")
    asked = Message(
        "user", "refund 42", tool_call_id=ParentCall("id-ticket", "call_1").key,
        origin="agent-tool",
    )  # fmt: skip
    await store.append_messages_atomic(
        f"id-{child}", 0, [asked, Message("assistant", "refunded", origin="agent-tool")],
        agent_name="refunds", session_name=child,
    )  # fmt: skip
    worker = SupportWorker(store)
    parent_page = await worker("GET", "/sessions/ticket/view")
    assert parent_page.status == 200, parent_page.body
    assert parent_page.text is not None
    assert f'class="child-link" href="/agents/refunds/sessions/{child}/view"' in parent_page.text
    child_page = await worker("GET", f"/sessions/{child}/view")
    assert child_page.text is not None
    assert 'class="parent-link" href="/sessions/ticket/view#call-call_1"' in child_page.text


async def test_retention_deletes_only_sessions_idle_past_the_setting(store: D1Store) -> None:
    worker = Worker(store)
    for name in ("old", "new"):
        await worker("POST", f"/sessions/{name}/messages", {"message": "hi"})
    new = await store.get_session("id-new")
    old = await store.get_session("id-old")
    assert new is not None
    assert old is not None
    days = 2
    now = old.updated_at / 1000 + days * 86400 + 0.5  # old just past it, new within it
    assert await run_retention(store, {}, now) == 0  # RETENTION_DAYS unset: keep all
    assert await run_retention(store, {"RETENTION_DAYS": str(days)}, now) == 1
    assert await store.get_session("id-old") is None
    assert await store.get_session("id-new") is not None
    with pytest.raises(ConfigurationError, match="RETENTION_DAYS"):
        await run_retention(store, {"RETENTION_DAYS": "-1"}, now)


@pytest.mark.parametrize("days", ["1e300", "inf", "1e9"])
async def test_retention_past_any_stored_time_keeps_everything(store: D1Store, days: str) -> None:
    # Its cut-off, before 1970 by more than 2**53 ms, was bound as a BigInt (D1 refuses
    # it) or made no int at all (inf): the cron failed. Now it is clamped: nothing is idle.
    worker = Worker(store)
    await worker("POST", "/sessions/kept/messages", {"message": "hi"})
    kept = await store.get_session("id-kept")
    assert kept is not None
    assert await run_retention(store, {"RETENTION_DAYS": days}, kept.updated_at / 1000 + 1) == 0
    assert await store.get_session("id-kept") is not None


async def test_max_session_tokens_stops_the_next_turn_with_budget_exceeded(
    store: D1Store,
) -> None:
    worker = Worker(store, {"MAX_SESSION_TOKENS": "200"})
    first = await worker("POST", "/sessions/spend/messages", {"message": "one"})
    assert first.body["status"] == "complete"  # 120 tokens after its first call: under 200
    second = await worker("POST", "/sessions/spend/messages", {"message": "two"})
    assert second.status == 200
    assert second.body["status"] == "budget_exceeded"
    assert second.body["error"]["code"] == "budget-exceeded"
    assert "240 tokens" in second.body["error"]["message"]

    worker.env["MAX_SESSION_TOKENS"] = "1000"
    resumed = await worker("POST", "/sessions/spend/resume")
    assert resumed.body["status"] == "complete"


@pytest.mark.parametrize("bad", ["0", "-3", "lots", "1.5"])
def test_a_bad_max_session_tokens_is_a_configuration_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="MAX_SESSION_TOKENS"):
        with_budget(AGENT, {"MAX_SESSION_TOKENS": bad})
    assert with_budget(AGENT, {"MAX_SESSION_TOKENS": ""}) is AGENT


@pytest.mark.parametrize("name", ["MAX_SESSION_TOKENS", "MAX_CONTEXT_TOKENS"])
@pytest.mark.parametrize("bad", ["0", "-3", "lots", "1.5"])
def test_a_bad_token_setting_is_a_configuration_error(name: str, bad: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        with_budget(AGENT, {name: bad})


def test_max_context_tokens_sets_the_agents_window() -> None:
    assert with_budget(AGENT, {"MAX_CONTEXT_TOKENS": "9000"}).max_context_tokens == 9000
    both = with_budget(AGENT, {"MAX_CONTEXT_TOKENS": "9000", "MAX_SESSION_TOKENS": "5"})
    assert (both.max_context_tokens, both.max_session_tokens) == (9000, 5)
    assert with_budget(AGENT, {"MAX_CONTEXT_TOKENS": " "}) is AGENT
