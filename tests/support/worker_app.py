"""The application that `durable-agents worker --app worker_app:make_runner` runs in the tests.

The agent of `process_agent` (a `safe_to_retry` lookup, two side-effecting tools,
its deterministic LLM), set up by environment variables, since the worker
process is started by the CLI:

    WORKER_APP_EFFECTS     the effects file the handlers log to (required)
    WORKER_APP_SEEN        a file the LLM appends to at each call that starts a turn:
                           the turn's user message, as one JSON line (the model saw it)
    WORKER_APP_DIE_AT      SIGKILL this process at its N-th checkpoint (default: never)
    WORKER_APP_DIE_ON      the checkpoints counted, of "llm" (before and after each LLM
                           call) and "tool" (in each handler, before and after its
                           effect); comma-separated, default both
    WORKER_APP_KILLS       a file to append the checkpoint's name to, before dying there
    WORKER_APP_READY_FILE  create this file once the runner is made (the pass begins)
    WORKER_APP_START_FILE  wait until this file exists before handing the runner over:
                           a start line for racing workers
    WORKER_APP_THINK_MS, WORKER_APP_HANDLER_MS  the LLM's and the handlers' sleeps

Every checkpoint lies in a window the at-most-once contract cares about: before
an LLM call (after the previous write), after it (the model answered, nothing of
it stored: a scheduled turn's message not stored yet), after write #1 (before a
handler's effect) and after an effect (before write #2).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tests.support.history_checks import append_effect
from tests.support.process_agent import AGENT, next_action

from durable_agents import LLMResponse, Message, ToolContext, ToolSpec
from durable_agents.testing import FunctionLLM
from durable_agents.worker import Runner

CHECKPOINTS = ("llm", "tool")


class Checkpoints:
    """Counts the checkpoints passed; kills this process at the `die_at`-th (after
    noting which in the `kills` file)."""

    def __init__(self, die_at: int, kinds: Sequence[str], kills: str | None = None) -> None:
        self.die_at = die_at
        self.kinds = frozenset(kinds)
        self.kills = kills
        self.passed = 0

    def reach(self, kind: str, where: str) -> None:
        if kind not in self.kinds:
            return
        self.passed += 1
        if self.passed == self.die_at:
            if self.kills:
                log_line(self.kills, where)
            os.kill(os.getpid(), signal.SIGKILL)


def log_line(path: str, text: str) -> None:
    """Append one line in one write (O_APPEND): a killed writer leaves whole lines."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def read_seen(path: str | os.PathLike[str]) -> list[str]:
    """The user messages the model saw at the start of a turn, in order."""
    try:
        with open(path) as file:
            return [json.loads(line) for line in file]
    except FileNotFoundError:
        return []


def turn_starts(messages: Sequence[Message]) -> str | None:
    """The turn's user message if this LLM call is its first (no reply to it yet)."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users or any(m.role == "assistant" for m in messages[users[-1] :]):
        return None
    return messages[users[-1]].content


def make_llm(points: Checkpoints, seen: str | None, think: float) -> FunctionLLM:
    async def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        first = turn_starts(messages)
        points.reach("llm", "before an LLM call" + (" starting a turn" if first else ""))
        if seen and first is not None:
            log_line(seen, json.dumps(first))
        if think:
            await asyncio.sleep(think)
        response = next_action(messages, tools)
        points.reach("llm", "after an LLM call" + (" starting a turn" if first else ""))
        return response

    return FunctionLLM(answer)


def make_handlers(points: Checkpoints, effects: str, delay: float) -> dict[str, Any]:
    def make(name: str) -> Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]:
        async def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            points.reach("tool", f"in a {name} handler, before its effect")
            await asyncio.sleep(delay)
            append_effect(effects, ctx.tool_name, ctx.tool_call_id, ctx.idempotency_key)
            points.reach("tool", f"in a {name} handler, after its effect")
            await asyncio.sleep(delay)
            return {"tool": name, "text": args["text"], "resumed": ctx.resumed}

        return handler

    return {t.name: make(t.name) for t in AGENT.tools}


def make_runner() -> Runner[Any]:
    env = os.environ
    start_file = env.get("WORKER_APP_START_FILE")
    if start_file:
        deadline = time.monotonic() + 30
        while not os.path.exists(start_file):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the start file {start_file} never appeared")
            time.sleep(0.001)
    kinds = env.get("WORKER_APP_DIE_ON", ",".join(CHECKPOINTS)).split(",")
    points = Checkpoints(int(env.get("WORKER_APP_DIE_AT", "0")), kinds, env.get("WORKER_APP_KILLS"))
    think = float(env.get("WORKER_APP_THINK_MS", "2")) / 1000
    delay = float(env.get("WORKER_APP_HANDLER_MS", "2")) / 1000
    llm = make_llm(points, env.get("WORKER_APP_SEEN"), think)
    runner = Runner(AGENT, llm, tools=make_handlers(points, env["WORKER_APP_EFFECTS"], delay))
    if env.get("WORKER_APP_READY_FILE"):
        os.close(os.open(env["WORKER_APP_READY_FILE"], os.O_CREAT | os.O_WRONLY, 0o644))
    return runner
