"""`Agent` and `ToolContext` are generic over their deps type, and need no parameter.

Checked with mypy (strict) on small programs, as a user's code would be.
"""

from __future__ import annotations

from pathlib import Path

import pytest
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


TYPED = Agent("typed", "", [lookup], deps_type=Deps)
PLAIN = Agent("plain", "", [untyped])
ANNOTATED: Agent = Agent("annotated")


async def main() -> None:
    llm = ScriptedLLM([])
    reveal_type(TYPED)
    reveal_type(PLAIN)
    await run(TYPED, llm=llm, message="hi", deps=Deps("u"))
    await run(PLAIN, llm=llm, message="hi", deps=3)
    await run(ANNOTATED, llm=llm, message="hi")
"""


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    path = tmp_path / "user_agent.py"
    path.write_text(source)
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(path)])
    return out + err, status


def test_deps_typed_and_untyped_both_type_check(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, PROGRAM)
    assert status == 0, out
    assert 'Revealed type is "durable_agents.agent.Agent[user_agent.Deps]"' in out
    assert 'Revealed type is "durable_agents.agent.Agent[Any]"' in out


def test_wrong_deps_for_a_typed_agent_is_a_type_error(tmp_path: Path) -> None:
    source = PROGRAM.replace('deps=Deps("u")', 'deps="not deps"')
    out, _ = _mypy(tmp_path, source)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1, out
    assert "run" in errors[0], out


def test_generic_forms_work_at_run_time() -> None:
    ctx = ToolContext[int]("s", "c", "t", "k", deps=3)
    assert ctx.deps == 3
    assert ToolContext("s", "c", "t", "k").deps is None
    assert Agent[int]("a", deps_type=int).deps_type is int


def test_a_parameterized_context_as_first_parameter_is_refused() -> None:
    from durable_agents import ConfigurationError

    async def handler(ctx: ToolContext[int]) -> None: ...

    with pytest.raises(ConfigurationError, match="the first parameter is the arguments"):
        tool(handler)
