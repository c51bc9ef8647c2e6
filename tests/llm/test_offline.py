"""The offline models: TestLLM (any agent, arguments from each tool's schema) and FunctionLLM."""

from __future__ import annotations

import json
from datetime import date, datetime, time, timedelta
from enum import Enum
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

import pytest
from pydantic import BaseModel, Field, HttpUrl

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    ToolSpec,
    run,
    tool,
)
from durable_agents.llm import FunctionLLM, TestLLM, llm_from_env
from durable_agents.llm.offline import arguments_for
from durable_agents.stores import sqlite_store
from durable_agents.testing import SimulatedCrash, crash_after_tool_results

# --- arguments from a schema -------------------------------------------------------------


class Color(Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str = Field(min_length=3)
    zip_code: int = Field(ge=10_000, le=99_999)


class Everything(BaseModel):
    count: int = Field(ge=5)
    positive: int = Field(gt=0)
    negative: int = Field(lt=-3)
    small: int = Field(le=0)
    fraction: float = Field(gt=0, lt=0.1)
    step: int = Field(ge=1, multiple_of=5)
    name: str = Field(min_length=4, max_length=10)
    short: str = Field(max_length=1)
    color: Color
    mode: Literal["fast", "slow"]
    fixed: Literal["only"]
    maybe: int | None
    defaulted: str = "keep me"
    flag: bool
    tags: list[str] = Field(min_length=2)
    unique: set[int] = Field(min_length=3)
    pair: tuple[int, str]
    scores: dict[str, int]
    address: Address
    addresses: list[Address] = Field(min_length=1)
    when: datetime
    day: date
    at: time
    wait: timedelta
    ident: UUID
    url: HttpUrl
    ipv4: IPv4Address
    ipv6: IPv6Address


def test_arguments_validate_against_the_model_they_came_from() -> None:
    arguments = arguments_for(Everything.model_json_schema())
    parsed = Everything.model_validate(arguments)  # raises if any field is wrong
    assert parsed.count == 5
    assert parsed.positive == 1
    assert parsed.negative == -4
    assert parsed.small == 0
    assert 0 < parsed.fraction < 0.1
    assert parsed.step == 5
    assert parsed.name == "aaaa"
    assert parsed.short == "a"
    assert parsed.color is Color.RED
    assert parsed.mode == "fast"
    assert parsed.fixed == "only"
    assert parsed.defaulted == "keep me"
    assert len(parsed.tags) == 2
    assert len(parsed.unique) == 3
    assert parsed.address == Address(street="aaa", zip_code=10_000)
    assert len(parsed.addresses) == 1
    assert parsed.ident == UUID("00000000-0000-4000-8000-000000000000")


def test_formats_pydantic_does_not_check_here_are_still_sensible() -> None:
    schema = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "host": {"type": "string", "format": "hostname"},
            "unknown": {"type": "string", "format": "x-custom", "minLength": 2},
        },
    }
    assert arguments_for(schema) == {
        "email": "user@example.com",
        "host": "example.com",
        "unknown": "aa",
    }


def test_optional_fields_get_a_value_of_their_type() -> None:
    arguments = arguments_for(Everything.model_json_schema())
    assert arguments["maybe"] == 1  # Optional[int] without a default: the int


def test_a_recursive_schema_ends() -> None:
    class Node(BaseModel):
        name: str
        child: Node | None = None
        children: list[Node] = []

    arguments = arguments_for(Node.model_json_schema())
    assert Node.model_validate(arguments) == Node(name="a")


def test_json_schema_dicts_and_empty_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "labels": {"type": "array", "items": {"type": "string"}},
            "any": {},
            "nullable": {"type": ["null", "string"]},
        },
        "required": ["id"],
    }
    assert arguments_for(schema) == {"id": 1, "labels": [], "any": {}, "nullable": "a"}
    assert arguments_for({"type": "object", "properties": {}}) == {}
    assert arguments_for({}) == {}


# --- TestLLM in a run --------------------------------------------------------------------


class OrderRef(BaseModel):
    order_id: str = Field(min_length=3)


class Refund(BaseModel):
    order_id: str
    cents: int = Field(gt=0)


def refund_agent(effects: list[tuple[str, Any]]) -> Agent:
    @tool(safe_to_retry=True)
    async def lookup_order(args: OrderRef, ctx: ToolContext) -> dict[str, str]:
        """Look an order up."""
        effects.append(("lookup_order", args.order_id))
        return {"status": "paid"}

    @tool
    async def issue_refund(args: Refund, ctx: ToolContext) -> dict[str, str]:
        """Refund an order."""
        effects.append(("issue_refund", args.cents))
        return {"refund": "re_1"}

    return Agent("refunds", "Refund orders.", [lookup_order, issue_refund])


async def test_calls_every_tool_once_at_once_then_replies() -> None:
    effects: list[tuple[str, Any]] = []
    llm = TestLLM()
    result = await run(refund_agent(effects), llm=llm, message="refund order 42")
    assert result.status == "complete"
    assert sorted(effects) == [("issue_refund", 1), ("lookup_order", "aaa")]
    assert result.steps == llm.calls == 2
    assert json.loads(result.response) == {
        "lookup_order": '{"status":"paid"}',
        "issue_refund": '{"refund":"re_1"}',
    }


async def test_one_per_step_calls_the_tools_in_turn_and_text_is_the_reply() -> None:
    effects: list[tuple[str, Any]] = []
    llm = TestLLM(one_per_step=True, text="done")
    result = await run(refund_agent(effects), llm=llm, message="go")
    assert [name for name, _ in effects] == ["lookup_order", "issue_refund"]
    assert result.steps == 3
    assert result.response == "done"
    assert [m.role for m in result.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip


async def test_call_tools_limits_what_it_calls_and_each_turn_starts_again(
    tmp_path: Path,
) -> None:
    effects: list[tuple[str, Any]] = []
    agent = refund_agent(effects)
    store = sqlite_store(tmp_path / "s.db")
    llm = TestLLM(call_tools=["lookup_order"])
    await run(agent, llm=llm, message="one", session_id="s", store=store)
    second = await run(agent, llm=llm, message="two", session_id="s", store=store)
    assert effects == [("lookup_order", "aaa")] * 2
    assert second.steps == 2
    await store.close()


async def test_a_resumed_turn_continues_without_calling_a_tool_again(tmp_path: Path) -> None:
    effects: list[tuple[str, Any]] = []
    agent = refund_agent(effects)
    store = sqlite_store(tmp_path / "s.db")
    with pytest.raises(SimulatedCrash):  # both handlers ran; their results were never stored
        await run(
            agent,
            llm=TestLLM(),
            message="refund",
            session_id="s",
            store=crash_after_tool_results(store),
        )
    result = await run(agent, llm=TestLLM(), session_id="s", store=store)
    assert result.status == "complete"
    assert result.steps == 1  # the reply: no tool called again
    assert [name for name, _ in effects].count("issue_refund") == 1
    assert [name for name, _ in effects].count("lookup_order") == 2  # safe: re-invoked
    lost = [e for m in result.messages if (e := ToolDurabilityError.from_message(m))]
    assert [e.tool_name for e in lost] == ["issue_refund"]
    await store.close()


def test_demo_is_test_llm() -> None:
    for env in ({}, {"LLM_PROVIDER": "demo"}, {"LLM_PROVIDER": " Demo "}):
        assert isinstance(llm_from_env(env), TestLLM)


# --- FunctionLLM -------------------------------------------------------------------------


def _reply_after_results(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    if messages[-1].role == "tool":
        return LLMResponse(f"saw {messages[-1].content}")
    return LLMResponse("", [ToolCall("c1", tools[0].name, {"order_id": "o-1"})])


async def test_function_llm_sync() -> None:
    effects: list[tuple[str, Any]] = []
    llm = FunctionLLM(_reply_after_results)
    result = await run(refund_agent(effects), llm=llm, message="look")
    assert result.response == 'saw {"status":"paid"}'
    assert effects == [("lookup_order", "o-1")]
    assert llm.calls == 2


async def test_function_llm_async_sees_the_whole_conversation_and_the_tools() -> None:
    seen: list[tuple[list[str], list[str]]] = []

    async def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        seen.append(([m.role for m in messages], [t.name for t in tools]))
        return LLMResponse("hello")

    result = await run(refund_agent([]), llm=FunctionLLM(answer), message="hi")
    assert result.response == "hello"
    assert seen == [(["system", "user"], ["lookup_order", "issue_refund"])]


async def test_function_llm_refuses_a_function_that_returns_no_response() -> None:
    llm = FunctionLLM(lambda messages, tools: "text")  # type: ignore[arg-type,return-value]
    result = await run(refund_agent([]), llm=llm, message="hi")
    assert result.status == "error"
    assert "FunctionLLM" in (result.error or "")
