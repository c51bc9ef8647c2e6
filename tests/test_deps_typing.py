"""`Agent` and `ToolContext` are generic over their deps type, and need no parameter;
`Agent` and `RunResult` over the output type too (`Agent(output_type=...)`).

Checked with mypy (strict) on small programs, as a user's code would be.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mypy import api as mypy_api

from durable_agents import Agent, ToolContext, tool

PROGRAM = """
from dataclasses import dataclass

from pydantic import BaseModel

from durable_agents import Agent, ToolContext, run, tool
from durable_agents.testing import ScriptedLLM


@dataclass
class Deps:
    api_url: str


class OrderRef(BaseModel):
    order_id: str


@tool(safe_to_retry=True)
async def lookup(args: OrderRef, ctx: ToolContext[Deps]) -> str:
    return ctx.deps.api_url + args.order_id


@tool
async def untyped(args: OrderRef, ctx: ToolContext) -> str:
    return str(ctx.deps.anything)


class Answer(BaseModel):
    order_id: str
    refund: bool


TYPED = Agent("typed", "", [lookup], deps_type=Deps)
PLAIN = Agent("plain", "", [untyped])
ANNOTATED: Agent = Agent("annotated")
ANSWERS = Agent("answers", "", [lookup], deps_type=Deps, output_type=Answer)


async def main() -> None:
    llm = ScriptedLLM([])
    reveal_type(TYPED)
    reveal_type(PLAIN)
    await run(TYPED, llm=llm, message="hi", deps=Deps("u"))
    await run(PLAIN, llm=llm, message="hi", deps=3)
    await run(ANNOTATED, llm=llm, message="hi")
    result = await run(ANSWERS, llm=llm, message="hi", deps=Deps("u"))
    reveal_type(result.output)
    if result.output is not None:
        print(result.output.refund)
"""


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    path = tmp_path / "user_agent.py"
    path.write_text(source)
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(path)])
    return out + err, status


def test_deps_typed_and_untyped_both_type_check(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, PROGRAM)
    assert status == 0, out
    assert 'Revealed type is "durable_agents.agent.Agent[user_agent.Deps, Any]"' in out
    assert 'Revealed type is "durable_agents.agent.Agent[Any, Any]"' in out
    assert 'Revealed type is "user_agent.Answer | None"' in out


def test_output_of_a_typed_agent_is_its_type(tmp_path: Path) -> None:
    source = PROGRAM.replace("print(result.output.refund)", "print(result.output.missing)")
    out, _ = _mypy(tmp_path, source)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1, out
    assert '"Answer" has no attribute "missing"' in errors[0], out


def test_wrong_deps_for_a_typed_agent_is_a_type_error(tmp_path: Path) -> None:
    source = PROGRAM.replace('deps=Deps("u")', 'deps="not deps"', 1)
    out, _ = _mypy(tmp_path, source)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1, out
    assert "run" in errors[0], out


def test_generic_forms_work_at_run_time() -> None:
    ctx = ToolContext[int]("s", "c", "t", "k", deps=3)
    assert ctx.deps == 3
    assert ToolContext("s", "c", "t", "k").deps is None
    assert Agent[int]("a", deps_type=int).deps_type is int


def test_a_parameterized_context_alone_is_the_context_of_a_tool_without_arguments() -> None:
    async def handler(ctx: ToolContext[int]) -> int:
        return ctx.deps

    made = tool(handler)
    assert made.input_schema == {"type": "object", "properties": {}}
    assert made.handler is not None
    value = made.handler({}, ToolContext[int]("s", "c", "t", "k", deps=3))
    assert asyncio.run(value) == 3
