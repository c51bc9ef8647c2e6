"""The agent `tests/cloudflare/test_dev_server_turn_features.py` serves: one scripted
model that takes the run loop through the turn features of issue 23, chosen by the first
word of the turn's message.

- `instructions` is a function of the turn's `RunContext`: the desk from the deps (the
  setting TF_DESK), the session's name and the turn's start (`ctx.now`).
- `output_type=Report`: every turn ends with a `final_result` call, whose `saw` is the
  system text that last LLM call was sent.
- `check_code` raises `ModelRetry` for a code that is not upper case (`max_tool_retries=1`).
- `send_note` waits for a person's approval, then posts the note to NOTES_API_URL: left
  empty, the dev stub `notes_stub`, which keeps every post with its Idempotency-Key
  (`GET /notes` lists them).
- `remind` schedules its text as a turn a day later (`ctx.schedule`).
- `shelf_of` comes from the catalogue's MCP server (`MCPTools(url_setting=
  "TF_CATALOG_MCP_URL")`): left empty, its dev stub `mcp_stub(shelf_of)`, answering
  inside the Worker itself.

The model's moves, by the message's first word:

    instructions  asks for a note (its text says which system text it saw), then answers
    again         answers at once
    typed         answers with a Report whose count is negative, then with a valid one
    retry         check_code("abc") (tool-retry), check_code("ABC"), then answers
    stubborn      check_code("abc") until its result is tool-failed, then answers
    note          asks for the note "draft", then answers with what its result said
    remind        remind("ping"), then answers with what its result said
    shelf         shelf_of("Dune") (an MCP tool), then answers with its result
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ModelRetry,
    RunContext,
    ToolCall,
    ToolContext,
    ToolSpec,
    tool,
)
from durable_agents.llm import FunctionLLM
from durable_agents.llm.settings import setting
from durable_agents.mcp import MCPTools, mcp_stub

SETTINGS = ("TF_DESK", "NOTES_API_URL")


@dataclass(frozen=True, slots=True)
class Deps:
    desk: str
    notes_url: str
    http: httpx.AsyncClient


class Report(BaseModel):
    """What the turn did."""

    summary: str
    count: int = Field(ge=0)
    saw: str


class Code(BaseModel):
    code: str = Field(min_length=1, max_length=20)


class Note(BaseModel):
    text: str = Field(min_length=1, max_length=200)
    channel: Literal["general", "ops"] = "general"


def instructions(ctx: RunContext[Deps]) -> str:
    return (
        f"You work the {ctx.deps.desk} for session {ctx.session_name}; this turn started at "
        f"{ctx.now.isoformat(timespec='microseconds')}."
    )


@tool(safe_to_retry=True)
def check_code(args: Code) -> dict[str, Any]:
    """Check a code: it must be upper case."""
    if args.code != args.code.upper():
        raise ModelRetry(f"code {args.code!r} must be upper case")
    return {"code": args.code, "valid": True}


class Reminder(BaseModel):
    text: str = Field(min_length=1, max_length=200)


@tool
def remind(args: Reminder, ctx: ToolContext[Deps]) -> dict[str, Any]:
    """Schedule a reminder a day from now."""
    made = ctx.schedule(args.text, delay_seconds=86_400)
    return {"schedule_id": made.schedule_id}


@tool(requires_approval=True, timeout=10)
async def send_note(args: Note, ctx: ToolContext[Deps]) -> dict[str, Any]:
    """Post a note to a channel, once a person approved it."""
    response = await ctx.deps.http.post(
        f"{ctx.deps.notes_url}/notes",
        json=args.model_dump(),
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    return dict(response.json())


class Title(BaseModel):
    title: str = Field(min_length=1, max_length=100)


@tool(safe_to_retry=True)
def shelf_of(args: Title) -> dict[str, Any]:
    """Say which shelf a book is on: the catalogue MCP server's tool (its dev stub's)."""
    return {"title": args.title, "shelf": "B-3"}


AGENT = Agent(
    "turn-features",
    instructions,
    [check_code, send_note, remind],
    toolsets=[MCPTools(url_setting="TF_CATALOG_MCP_URL", name="catalog")],
    deps_type=Deps,
    output_type=Report,
    max_tool_retries=1,
    max_steps=8,
)


def make_deps(env: Any, http: httpx.AsyncClient) -> Deps:
    notes = str(setting(env, "NOTES_API_URL") or "").rstrip("/")
    return Deps(str(setting(env, "TF_DESK") or "day desk"), notes, http)


def make_llm(env: Any) -> FunctionLLM:
    return FunctionLLM(play)


def play(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """The next move in the current turn, from the conversation alone (see the docstring)."""
    system = messages[0].content
    start = max(i for i, m in enumerate(messages) if m.role == "user")
    turn = messages[start:]
    move = turn[0].content.split()[0]
    results = [(m.tool_name, json.loads(m.content)) for m in turn if m.role == "tool"]
    last = results[-1][1] if results else {}
    call_id = f"tf_{len(messages)}"

    def call(name: str, arguments: dict[str, Any], text: str = "") -> LLMResponse:
        return LLMResponse(text, [ToolCall(call_id, name, arguments)])

    def answer(summary: str, count: int = 1) -> LLMResponse:
        return call("final_result", {"summary": summary, "count": count, "saw": system})

    if move in ("instructions", "note"):
        if not results:
            text = "hello" if move == "instructions" else "draft"
            return call("send_note", {"text": text, "channel": "general"}, f"saw: {system}")
        edited = "edited_arguments" in last
        return answer(f"note {last.get('result', last).get('id')}; edited: {edited}")
    if move == "remind":
        if not results:
            return call("remind", {"text": "ping"})
        return answer(json.dumps(last))
    if move == "shelf":
        if not results:
            return call("shelf_of", {"title": "Dune"})
        return answer(json.dumps(last))
    if move == "typed":
        return answer("typed", -1 if not results else 3)
    if move == "retry":
        if not results:
            return call("check_code", {"code": "abc"})
        if last.get("kind") == "tool-retry":
            return call("check_code", {"code": "ABC"})
        return answer(f"code {last.get('code')} valid: {last.get('valid')}")
    if move == "stubborn":
        if last.get("kind") != "tool-failed":
            return call("check_code", {"code": "abc"})
        return answer("gave up", len(results))
    return answer(move)


# --- dev stub: a notes API in memory, for an empty NOTES_API_URL ----------------------

_notes: list[dict[str, Any]] = []


def notes_stub(method: str, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, Any]:
    """`POST /notes` keeps the note with its Idempotency-Key; `GET /notes` lists them."""
    if method == "POST" and path == "/notes":
        note = {**json.loads(body), "key": headers.get("idempotency-key")}
        _notes.append(note)
        return 200, {"id": f"note_{len(_notes)}", **note}
    if method == "GET" and path == "/notes":
        return 200, {"notes": _notes}
    return 404, {"error": f"the notes stub has no {method} {path}"}


DEV_STUBS = {"NOTES_API_URL": notes_stub, "TF_CATALOG_MCP_URL": mcp_stub(shelf_of, name="catalog")}
