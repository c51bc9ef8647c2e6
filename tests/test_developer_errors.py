"""Errors a developer needs to see (issue 32, item 5), on CPython.

- A handler that raises: the model gets its failure as the call's result, and the
  traceback goes to the `durable_agents` logger once, with the session and the call
  (never the arguments). The kit configures no logging itself.
- A toolset that lacks a setting (`MCPTools(url_setting="MCP_URL")` with MCP_URL unset):
  the turn ends with `error_code` "configuration", naming the toolset, the setting and
  where it is set; the message is kept, and the turn goes on once it is set. The
  Worker answers it as any `ConfigurationError` (500 "configuration"), not a 502 that
  blames a server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    ModelRetry,
    ToolCall,
    ToolContext,
    ToolFailure,
    run,
    tool,
)
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.app import ERROR_STATUS, Command, LiveSession, serve_session
from durable_agents.mcp import MCPTools, mcp_stub
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM
from durable_agents.testing.fake_d1 import FakeD1Database
from durable_agents.tools import RunContext, Tool

SESSION = "ab" * 32


class Reader(BaseModel):
    email: str


@tool
def look_up_reader(args: Reader) -> dict[str, Any]:
    """Look a reader up by email."""
    raise KeyError(f"no card for {args.email}")


@tool
async def slow_notice(args: Reader) -> str:
    """Send a notice (a side effect) that never finishes."""
    await asyncio.sleep(10)
    return "sent"


@tool
def fussy(args: Reader, ctx: ToolContext) -> str:
    """Sends the model back, or fails on purpose."""
    if args.email == "retry":
        raise ModelRetry("give the whole address")
    raise ToolFailure("the card service said no")


def calls(*made: tuple[str, str, dict[str, Any]]) -> ScriptedLLM:
    return ScriptedLLM(
        [LLMResponse(tool_calls=[ToolCall(i, n, a) for i, n, a in made]), LLMResponse("Done.")]
    )


async def test_a_handler_that_raises_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent("desk", "Help readers.", [look_up_reader, fussy])
    llm = calls(
        ("c1", "look_up_reader", {"email": "ada@example.org"}),
        ("c2", "fussy", {"email": "retry"}),  # ModelRetry: the model's business, not logged
        ("c3", "fussy", {"email": "x"}),  # ToolFailure: a failure on purpose, not logged
    )
    with caplog.at_level(logging.ERROR, logger="durable_agents"):
        result = await run(agent, llm=llm, message="Who is ada?", session_id=None)
    assert result.status == "complete"
    (record,) = caplog.records  # once per failure
    assert record.name == "durable_agents"
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        f"tool 'look_up_reader' failed in session {result.session_id} (call c1); the model "
        "was told tool-failed. Its traceback:"
    )
    assert "ada@example.org" not in record.getMessage()  # arguments may be personal
    assert record.exc_info is not None
    assert record.exc_info[0] is KeyError
    traceback = caplog.text
    assert "Traceback (most recent call last):" in traceback
    assert 'raise KeyError(f"no card for {args.email}")' in traceback  # the handler's line


async def test_a_timed_out_side_effect_is_logged_as_what_the_model_was_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    timed = Tool(
        name="slow_notice", description="Send a notice.", input_schema=slow_notice.input_schema,
        input_model=Reader, handler=slow_notice.handler, timeout=0.05,
    )  # fmt: skip
    agent = Agent("desk", "Help readers.", [timed])
    llm = calls(("c9", "slow_notice", {"email": "ada@example.org"}))
    with caplog.at_level(logging.ERROR, logger="durable_agents"):
        result = await run(agent, llm=llm, message="Tell ada")
    assert result.status == "complete"
    (record,) = caplog.records
    assert "tool 'slow_notice' failed" in record.getMessage()
    assert "the model was told tool-durability-error" in record.getMessage()


def test_the_kit_configures_no_logging() -> None:
    logger = logging.getLogger("durable_agents")
    assert (logger.handlers, logger.level, logger.propagate) == ([], logging.NOTSET, True)


# -- a toolset's missing setting --------------------------------------------------------------


@tool(safe_to_retry=True)
def list_shelves() -> list[str]:
    """List the shelves."""
    return ["fiction", "history"]


SHELVES = mcp_stub(list_shelves, name="shelves")


def stub_client() -> httpx.AsyncClient:
    """A client whose requests the shelves stub answers, wherever they go."""

    async def answer(request: httpx.Request) -> httpx.Response:
        status, body = await SHELVES(request.method, "/", request.content, request.headers)
        return httpx.Response(status) if body is None else httpx.Response(status, json=body)

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def shelves_agent() -> Agent:
    return Agent(
        "desk", "Help readers.", toolsets=[MCPTools(url_setting="SHELVES_MCP_URL", name="shelves")]
    )


async def test_a_missing_setting_says_which_toolset_needs_it_and_where_to_set_it(
    tmp_path: Path,
) -> None:
    agent = shelves_agent()
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "list_shelves", {})]),
                       LLMResponse("Two shelves.")])  # fmt: skip
    store = sqlite_store(tmp_path / "agents.db")
    failed = await run(agent, llm=llm, message="shelves?", session_id="s", store=store,
                       settings={"SHELVES_MCP_URL": "  "})  # fmt: skip
    assert (failed.status, failed.error_code) == ("error", "configuration")
    assert failed.error == (
        "MCPTools(url_setting='SHELVES_MCP_URL', name='shelves'): its tools could not be "
        "listed: the setting SHELVES_MCP_URL (the MCP server's URL) is missing or empty. Set "
        "SHELVES_MCP_URL where the agent's settings come from: on Cloudflare, [vars] in "
        "wrangler.toml or a secret (`scripts/wrangler secret put SHELVES_MCP_URL`); with "
        "scripts/dev, .dev.vars or the environment (or a dev stub in the agent module's "
        "DEV_STUBS); with run(), its settings= (default os.environ)"
    )
    assert llm.calls == []
    assert [m.content for m in await store.load_messages("s")] == ["shelves?"]  # kept
    settings = {"SHELVES_MCP_URL": "https://shelves.example/mcp"}
    async with stub_client() as http:
        resumed = await run(
            agent, llm=llm, session_id="s", store=store, http=http, settings=settings
        )
    await store.close()
    assert (resumed.status, resumed.response) == ("complete", "Two shelves.")


async def test_a_wrong_setting_or_a_toolsets_own_configuration_error() -> None:
    llm = ScriptedLLM([])
    wrong = await run(shelves_agent(), llm=llm, message="hi",
                      settings={"SHELVES_MCP_URL": "shelves.example"})  # fmt: skip
    assert wrong.error_code == "configuration"
    assert wrong.error is not None
    assert "SHELVES_MCP_URL must be an http:// or https:// URL" in wrong.error
    assert "Fix SHELVES_MCP_URL where the agent's settings come from" in wrong.error

    class Unready:
        settings: tuple[str, ...] = ()

        async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]:
            raise ConfigurationError("Unready: call setup() first")

    own = await run(Agent("a", "", toolsets=[Unready()]), llm=llm, message="hi")
    assert (own.error_code, own.error) == (
        "configuration",
        "Unready: its tools could not be listed: call setup() first",
    )
    assert llm.calls == []


async def test_the_worker_answers_it_as_a_configuration_error_and_resumes_it() -> None:
    store = d1_store(FakeD1Database())
    await store.create_tables()
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "list_shelves", {})]),
                       LLMResponse("Two shelves.")])  # fmt: skip

    async def serve(command: Command, env: dict[str, str]) -> Any:
        async with stub_client() as http:
            return await serve_session(
                command, session_id=SESSION, store=store, env=env, live=LiveSession(),
                agent=shelves_agent(), make_deps=lambda env, http: None, llm=llm,
                http_client=http,
            )  # fmt: skip

    reply = await serve(Command("message", "shelves?"), {"API_TOKEN": "t"})
    assert reply.status == ERROR_STATUS[ConfigurationError] == 500
    assert reply.body["status"] == "error"
    error = reply.body["error"]
    assert error["code"] == "configuration"
    assert error["message"].startswith(
        "MCPTools(url_setting='SHELVES_MCP_URL', name='shelves'): its tools could not be listed"
    )
    assert "`scripts/wrangler secret put SHELVES_MCP_URL`" in error["message"]
    assert error["message"].endswith(
        ". The session keeps your message: once the setting is set, POST .../resume finishes "
        "the turn, or send a new message"
    )
    env = {"API_TOKEN": "t", "SHELVES_MCP_URL": "https://shelves.example/mcp"}
    resumed = await serve(Command("resume"), env)
    assert (resumed.status, resumed.body["response"]) == (200, "Two shelves."), resumed.body
