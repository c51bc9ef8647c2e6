"""The crash sweep: crash a multi-turn run at every write boundary and inside every
handler, resume, and check the at-most-once invariants each time.

Used on CPython (tests/test_crash_sweep.py: SQLite and the D1 store over the
fake binding) and inside workerd on its real D1
(tests/runtime/test_crash_sweep_d1.py). One workload, two turns:

    turn "first":  step 1  lookup ‖ post        (parallel, ids left to the loop)
                   step 2  charge ‖ lookup      (parallel, ids from the model)
                   step 3  post
                   final text
    turn "second": the same plan

Crash points, each in its own session:
- every atomic append, crashing before it lands and right after it lands;
- every handler invocation, crashing after its side effect and before it.
A crashed run is followed by resumes until the turn finishes: `message=None`
once the turn's user message is stored, the message again if it is not
(what a caller does when a turn's first write never landed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.support.history_checks import (
    Effect,
    assert_at_most_once,
    assert_durability_errors_only_for,
    assert_effects_match_history,
    assert_well_formed,
    durability_errors,
)

from durable_agents import (
    LLM,
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    run,
    tool,
)
from durable_agents.stores import Store
from durable_agents.testing import FunctionLLM, SimulatedCrash, count_writes, crash_on_write

TURNS = ("first", "second")
SAFE_TOOLS = frozenset({"lookup"})
UNSAFE_TOOLS = frozenset({"post", "charge"})


def plan(turn: str, step: int) -> list[ToolCall]:
    """The calls the model makes at `step` (0-based) of `turn`; [] means the final reply."""
    if step == 0:
        return [ToolCall("", "lookup", {"q": f"{turn}-a"}), ToolCall("", "post", {"text": turn})]
    if step == 1:
        return [
            ToolCall(f"{turn}-charge", "charge", {"cents": 500}),
            ToolCall(f"{turn}-lookup", "lookup", {"q": f"{turn}-b"}),
        ]
    if step == 2:
        return [ToolCall("", "post", {"text": f"{turn} again"})]
    return []


def policy(messages: list[Message], tools: Sequence[ToolSpec] = ()) -> LLMResponse:
    """The model: reads the conversation, plays `plan`. Resumes like a real model would."""
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    turn = messages[last_user].content
    step = sum(1 for m in messages[last_user:] if m.role == "assistant")
    calls = plan(turn, step)
    return LLMResponse(text="" if calls else f"{turn} done", tool_calls=calls)


def policy_llm() -> LLM:
    """`policy` as an LLM (the adapter sweeps put a wire format in between instead)."""
    return FunctionLLM(policy)


@dataclass
class Crash:
    """Where to crash: the n-th append (before/after it lands) or the n-th handler call."""

    at: Literal["write", "handler"]
    n: int
    when: Literal["before", "after"]

    def __str__(self) -> str:
        return f"{self.at} #{self.n} ({self.when})"


@dataclass
class Outcome:
    crash: Crash | None
    session_id: str
    history: list[Message]
    effects: list[Effect]
    appends: int
    handler_calls: int
    crashed: bool
    durability_errors: int = 0
    resumes: int = 0


@dataclass
class _Handlers:
    session_effects: list[Effect]
    crash: Crash | None
    calls: int = 0
    crashed: bool = False
    tools: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        def make(name: str) -> Any:
            async def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
                self.calls += 1
                crash_here = (
                    self.crash is not None
                    and self.crash.at == "handler"
                    and self.crash.n == self.calls
                    and not self.crashed
                )
                if crash_here and self.crash is not None and self.crash.when == "before":
                    self.crashed = True
                    raise SimulatedCrash(f"before the effect of {name} {ctx.tool_call_id}")
                self.session_effects.append(Effect(name, ctx.tool_call_id, ctx.idempotency_key))
                if crash_here:
                    self.crashed = True
                    raise SimulatedCrash(f"after the effect of {name} {ctx.tool_call_id}")
                return {"tool": name, "args": args}

            return handler

        schema = {"type": "object"}
        self.tools = [
            tool(name="lookup", description="Read.", input=schema, handler=make("lookup"),
                 safe_to_retry=True),
            tool(name="post", description="Post.", input=schema, handler=make("post")),
            tool(name="charge", description="Charge.", input=schema, handler=make("charge")),
        ]  # fmt: skip


async def play(
    store: Store,
    session_id: str,
    crash: Crash | None,
    llm_factory: Callable[[], LLM] = policy_llm,
) -> Outcome:
    """Play both turns on `session_id`, crashing once at `crash`, resuming until done."""
    effects: list[Effect] = []
    handlers = _Handlers(effects, crash)
    agent = Agent("sweeper", "Follow the plan.", handlers.tools, max_steps=10)
    crashing = crash_on_write(store, crash.n, when=crash.when) if crash and crash.at == "write" \
        else count_writes(store)  # fmt: skip
    crashed, resumes = False, 0
    for turn in TURNS:
        while True:
            history = await store.load_messages(session_id)
            started = any(m.role == "user" and m.content == turn for m in history)
            target: Store = store if crashed else crashing
            try:
                result = await run(
                    agent,
                    llm=llm_factory(),
                    message=None if started else turn,
                    session_id=session_id,
                    store=target,
                )
            except SimulatedCrash:
                crashed, resumes = True, resumes + 1
                continue
            assert result.status == "complete", (crash, result.error)
            break
        crashed = crashed or handlers.crashed
    history = await store.load_messages(session_id)
    return Outcome(
        crash=crash,
        session_id=session_id,
        history=history,
        effects=effects,
        appends=crashing.appends,
        handler_calls=handlers.calls,
        crashed=crashed,
        durability_errors=len(durability_errors(history)),
        resumes=resumes,
    )


def check(outcome: Outcome) -> None:
    """The invariants every outcome must satisfy, crash or not."""
    history = outcome.history
    assert_well_formed(history, turns=len(TURNS), user_messages=list(TURNS))
    assert_durability_errors_only_for(history, UNSAFE_TOOLS)
    assert_at_most_once(outcome.effects, UNSAFE_TOOLS)
    assert_effects_match_history(
        history,
        outcome.effects,
        session_id=outcome.session_id,
        safe_tools=SAFE_TOOLS,
        unsafe_tools=UNSAFE_TOOLS,
    )
    assert [m.content for m in history if m.is_final_reply] == [f"{t} done" for t in TURNS]


@dataclass
class SweepReport:
    scenarios: int
    crashes: int
    durability_errors: int
    safe_reinvocations: int
    baseline_appends: int
    baseline_handler_calls: int

    def __str__(self) -> str:
        return (
            f"{self.scenarios} crash points ({self.baseline_appends} appends x before/after, "
            f"{self.baseline_handler_calls} handler calls x before/after effect): "
            f"{self.durability_errors} durability errors stored, "
            f"{self.safe_reinvocations} safe re-invocations, every invariant held"
        )


async def sweep(
    store: Store, prefix: str = "sweep", llm_factory: Callable[[], LLM] = policy_llm
) -> SweepReport:
    """Run every crash point on `store` (one session each) and check every outcome."""
    baseline = await play(store, f"{prefix}-baseline", None, llm_factory)
    check(baseline)
    assert baseline.durability_errors == 0
    crashes = [
        Crash(at, n, when)
        for at, total in (("write", baseline.appends), ("handler", baseline.handler_calls))
        for n in range(1, total + 1)
        for when in ("before", "after")
    ]
    report = SweepReport(len(crashes), 0, 0, 0, baseline.appends, baseline.handler_calls)
    for index, crash in enumerate(crashes):
        outcome = await play(store, f"{prefix}-{index}", crash, llm_factory)
        assert outcome.crashed, f"{crash}: the crash point was never reached"
        try:
            check(outcome)
        except AssertionError as exc:
            raise AssertionError(f"after a crash at {crash}: {exc}") from None
        report.crashes += 1
        report.durability_errors += outcome.durability_errors
        report.safe_reinvocations += sum(1 for e in outcome.effects if e.tool_name in SAFE_TOOLS)
        report.safe_reinvocations -= sum(1 for e in baseline.effects if e.tool_name in SAFE_TOOLS)
    assert report.durability_errors > 0, "no crash point produced a durability error"
    assert report.safe_reinvocations > 0, "no crash point re-invoked a safe tool"
    return report
