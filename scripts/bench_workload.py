#!/usr/bin/env python3
"""The workload of `bench_core.py`, and its in-memory turn as a program of its own.

    .venv/bin/python scripts/bench_workload.py 3   # CPU seconds per step of 3 turns

Why a module of its own: `bench_core.py --against REV` runs the same in-memory turn
on the kit as it was at REV (its `src/` first on PYTHONPATH, in a subprocess) and
on this tree's, and an old kit has none of what `bench_core.py` imports besides.
So this file imports only what every version of the kit has had: `Agent`,
`LLMResponse`, `ToolCall`, `run`, `tool` and `memory_store`.

Every step the "LLM" (an object that answers instantly) asks for one tool call
whose argument is a 200-character string, the tool answers with a 300-character
string, and after the last step the LLM gives a short final reply. Content is
deterministic; nothing is random.
"""

import asyncio
import gc
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import durable_agents
from durable_agents import Agent, LLMResponse, ToolCall, run, tool
from durable_agents.stores import memory_store

ARGUMENT_CHARS = 200
RESULT_CHARS = 300
USER_MESSAGE = "Record every item of the backlog, one call per item."
FINAL_REPLY = "All items recorded."
TOOL_NAME = "record"
FLAT_STEPS = 200  # the in-memory turn's tool steps


def filler(chars: int, tag: str) -> str:
    """Deterministic text of exactly `chars` characters, distinct per `tag`."""
    unit = f"{tag}: lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    return (unit * (chars // len(unit) + 1))[:chars]


def call_id(step: int) -> str:
    return f"call_{step:06d}"


def tool_arguments(step: int) -> dict[str, Any]:
    return {"item": filler(ARGUMENT_CHARS, f"item {step}")}


def tool_result(tool_call_id: str) -> str:
    return filler(RESULT_CHARS, f"recorded {tool_call_id}")


def record_handler(args: dict[str, Any], ctx: Any) -> str:
    return tool_result(ctx.tool_call_id)


RECORD = tool(
    name=TOOL_NAME,
    description="Record one backlog item (a side effect: not safe to retry).",
    input={"properties": {"item": {"type": "string"}}, "required": ["item"]},
    handler=record_handler,
)


def make_agent(steps: int, **settings: Any) -> Agent:
    return Agent(
        "bench",
        instructions="You record backlog items.",
        tools=[RECORD],
        max_steps=steps + 1,
        **settings,
    )


class InstantLLM:
    """Asks for `steps` tool calls, one per chat(), then replies with text.

    `stamps` holds the time of every chat() call, so step i took
    stamps[i + 1] - stamps[i] (both writes and the handler included).
    `turn` prefixes the call ids: a session's turns each need ids of their own
    (a repeated one would be given a new id by the run loop, a cost of its own).
    `clock` reads the stamps (`time.thread_time`: CPU time, what other processes
    on the machine do not change)."""

    def __init__(
        self, steps: int, turn: str = "", clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.steps = steps
        self.turn = turn
        self.clock = clock
        self.calls = 0
        self.stamps: list[float] = []

    async def chat(self, messages: list[Any], tools: list[Any]) -> LLMResponse:
        self.stamps.append(self.clock())
        self.calls += 1
        if self.calls > self.steps:
            return LLMResponse(text=FINAL_REPLY)
        step = self.calls
        call = ToolCall(self.turn + call_id(step), TOOL_NAME, tool_arguments(step))
        return LLMResponse(tool_calls=[call])


async def memory_turn(agent: Agent) -> float:
    """CPU seconds per step of one FLAT_STEPS-step turn on a new `memory_store()`, no
    session (`time.thread_time`: the machine's other load does not count)."""
    llm = InstantLLM(FLAT_STEPS, clock=time.thread_time)
    gc.collect()
    start = time.thread_time()
    result = await run(agent, llm=llm, message=USER_MESSAGE, store=memory_store())
    seconds = time.thread_time() - start
    if result.status != "complete" or llm.calls != FLAT_STEPS + 1:
        raise RuntimeError(f"unexpected turn: {result.status} {result.error}, {llm.calls} calls")
    return seconds / FLAT_STEPS


async def memory_turns(turns: int) -> list[float]:
    """CPU seconds per step of each of `turns` turns, after one not counted (a first
    turn's one-time costs: caches filled, code specialised)."""
    agent = make_agent(FLAT_STEPS)
    await memory_turn(agent)
    return [await memory_turn(agent) for _ in range(turns)]


def main() -> None:
    """Prints, as JSON, where the kit was imported from and each turn's CPU per step."""
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    per_step = asyncio.run(memory_turns(turns))
    print(json.dumps({"kit": durable_agents.__file__, "per_step": per_step}))


if __name__ == "__main__":
    main()
