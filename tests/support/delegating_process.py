"""A real process whose agent calls another agent as a tool, to be SIGKILLed at a chosen point.

    python tests/support/delegating_process.py --db PATH --effects PATH --session S
        [--mode send|resume] [--pause-at POINT] [--gated]

`support` (the parent) has one tool, `agent_tool("refunds")`; `refunds` (the child)
has a side-effecting `refund`, whose handler logs its effect to the effects file
(`history_checks.append_effect`). Both run on one SQLite file, the child through
`run(agents=)`. The models are functions of the history: the parent asks refunds once
and passes its answer on; the child refunds order 42 once and says how it went. With
`--gated`, `refund` requires a person's approval: the send ends `awaiting_approval`,
and the test decides the child's call (from the parent's session) before resuming.

`--mode send` starts the parent's turn; `resume` is `run(message=None)` on it. With
`--pause-at`, the process prints `paused` at that point and blocks (the whole
process: nothing more is written) until the test kills it:

    before-child        the parent's write #1 landed (its call to refunds), no child yet
    child-call-stored   the child's write #1 landed (its call to refund), no handler ran
    child-handler       refund's effect is logged, its handler still in flight
    child-reply         the child's final reply landed, the parent's write #2 not
    child-claimed       (--gated, resuming) the child claimed its approved call, no handler ran

Protocol: `ready` once imported, then (unless paused and killed) one JSON line
`{"status", "response"}`; exit 0 when the turn completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.history_checks import append_effect

from durable_agents import (
    Agent,
    LLMResponse,
    LocalAgent,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    agent_tool,
    run,
    tool,
)
from durable_agents.stores import sqlite_store
from durable_agents.testing import FunctionLLM

POINTS = ("before-child", "child-call-stored", "child-handler", "child-reply")
# Where a resume of a parent whose child's approved call was decided meanwhile is killed.
APPROVAL_POINTS = ("child-claimed", "child-handler", "child-reply")
PARENT_CALL = "call_support_1"
ASK = "refund order 42"

_ORDER = {"properties": {"order": {"type": "string"}}, "required": ["order"]}
REFUND = tool(name="refund", description="Refund an order (a side effect).", input=_ORDER)
REFUNDS = Agent("refunds", "You refund orders.", [REFUND])
GATED_REFUND = tool(
    name="refund", description="Refund an order (a side effect).", input=_ORDER,
    requires_approval=True,
)  # fmt: skip
GATED_REFUNDS = Agent("refunds", "You refund orders.", [GATED_REFUND])
SUPPORT = Agent(
    "support", "You help customers.", [agent_tool("refunds", description="Refunds orders.")]
)


def parent_model(messages: list[Message], tools: Sequence[ToolSpec]) -> LLMResponse:
    last = messages[-1]
    if last.role == "user":
        return LLMResponse(tool_calls=[ToolCall(PARENT_CALL, "refunds", {"message": ASK})])
    return LLMResponse(text=f"support: {last.content}")


def child_model(messages: list[Message], tools: Sequence[ToolSpec]) -> LLMResponse:
    last = messages[-1]
    if last.role == "user":
        return LLMResponse(tool_calls=[ToolCall("call_refund_1", "refund", {"order": "42"})])
    return LLMResponse(text=f"refunds: {last.content}")


def pause() -> None:
    """Say so and freeze the whole process (a blocking sleep: no task runs on)."""
    print("paused", flush=True)
    time.sleep(3600)


class PausingStore:
    """The SQLite store, pausing after the append that `point` names."""

    def __init__(self, store: Any, point: str | None, parent: str) -> None:
        self.store = store
        self.point = point
        self.parent = parent

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: list[Message], **kw: Any
    ) -> None:
        await self.store.append_messages_atomic(session_id, expected_seq, messages, **kw)
        calls = any(m.tool_calls for m in messages)
        replies = any(m.is_final_reply for m in messages)
        claims = any(a.event == "claimed" for a in kw.get("approvals", ()))
        parent = session_id == self.parent
        if (
            (self.point == "before-child" and parent and calls)
            or (self.point == "child-call-stored" and not parent and calls)
            or (self.point == "child-reply" and not parent and replies)
            or (self.point == "child-claimed" and not parent and claims)
        ):
            pause()


async def main(args: argparse.Namespace) -> int:
    async def refund(order: dict[str, Any], ctx: ToolContext) -> str:
        append_effect(args.effects, ctx.tool_name, ctx.tool_call_id, ctx.idempotency_key)
        if args.pause_at == "child-handler":
            pause()
        return f"refunded order {order['order']}"

    refunds = GATED_REFUNDS if args.gated else REFUNDS
    child = LocalAgent(refunds, llm=FunctionLLM(child_model), tools={"refund": refund})
    async with sqlite_store(args.db) as base:
        store = PausingStore(base, args.pause_at, args.session)
        result = await run(
            SUPPORT,
            llm=FunctionLLM(parent_model),
            message="please refund my order" if args.mode == "send" else None,
            session_id=args.session,
            store=store,  # type: ignore[arg-type]  # a Store, by delegation
            agents={"refunds": child},
        )
    print(json.dumps({"status": result.status, "response": result.response}), flush=True)
    return 0 if result.status == "complete" else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--mode", choices=["send", "resume"], default="send")
    parser.add_argument("--pause-at", choices=sorted({*POINTS, *APPROVAL_POINTS}))
    parser.add_argument("--gated", action="store_true")
    return parser.parse_args(argv)


SCRIPT = Path(__file__).resolve()

if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    print("ready", flush=True)
    sys.exit(asyncio.run(main(arguments)))
