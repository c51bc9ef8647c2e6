"""Approval bound to the exact call (durable_agents.approvals): approve once, run once,
never run what was not approved. Every rule on SQLite and the D1 store (fake binding;
tests/runtime runs the store checks on real D1), the store events on memory too, and a
crash sweep over every write with approvals in the loop."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ApprovalAlreadyDecidedError,
    ApprovalDigestMismatchError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    LLMResponse,
    Message,
    RunResult,
    SessionNotFoundError,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    approval_digest,
    approve,
    pending_approvals,
    run,
    tool,
)
from durable_agents.messages import tool_error
from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.testing import (
    ScriptedLLM,
    SimulatedCrash,
    count_writes,
    crash_on_write,
)

SESSION = "s"


class Refund(BaseModel):
    order_id: str
    amount_cents: int


class Order(BaseModel):
    order_id: str


class Effects(Counter[str]):
    """Handler runs by call id."""


def refund_agent(effects: Effects) -> Agent:
    @tool(safe_to_retry=True)
    async def lookup_order(args: Order, ctx: ToolContext) -> dict[str, Any]:
        """Look an order up."""
        effects[ctx.tool_call_id] += 1
        return {"order_id": args.order_id, "paid_cents": 5000}

    @tool(requires_approval=True)
    async def issue_refund(args: Refund, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order."""
        effects[ctx.tool_call_id] += 1
        return {"refunded_cents": args.amount_cents}

    @tool
    async def notify(args: Order, ctx: ToolContext) -> str:
        """Tell the customer."""
        effects[ctx.tool_call_id] += 1
        return "sent"

    return Agent("refunds", "Refund what is asked.", [lookup_order, issue_refund, notify])


LOOKUP = ToolCall("l1", "lookup_order", {"order_id": "A-1"})
REFUND = ToolCall("r1", "issue_refund", {"order_id": "A-1", "amount_cents": 1500})
REFUND_2 = ToolCall("r2", "issue_refund", {"order_id": "B-2", "amount_cents": 700})
NOTIFY = ToolCall("n1", "notify", {"order_id": "A-1"})


def reply_from_results(messages: list[Message], tools: Any) -> LLMResponse:
    results = [m.content for m in messages if m.role == "tool"]
    return LLMResponse(text="done: " + " | ".join(results))


def llm_for(*calls: ToolCall) -> ScriptedLLM:
    return ScriptedLLM([LLMResponse(tool_calls=list(calls)), reply_from_results])


async def start(store: Store, effects: Effects, *calls: ToolCall) -> RunResult:
    return await run(
        refund_agent(effects), llm=llm_for(*calls), message="refund A-1", session_id=SESSION,
        store=store,
    )  # fmt: skip


async def resume(store: Store, effects: Effects, llm: ScriptedLLM | None = None) -> RunResult:
    llm = llm or ScriptedLLM([reply_from_results])
    return await run(refund_agent(effects), llm=llm, session_id=SESSION, store=store)


# -- the digest ---------------------------------------------------------------------


def test_the_digest_is_exactly_the_documented_encoding() -> None:
    # Another program computes it from the definition in docs/approvals.md alone.
    arguments = {"order_id": "Å-1", "amount_cents": 1500, "note": None, "items": [2, 1]}
    text = json.dumps(
        [SESSION, "r1", "issue_refund", arguments],
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
    )  # fmt: skip
    assert '"amount_cents":1500,"items":[2,1],"note":null,"order_id":"Å-1"' in text
    expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert approval_digest(SESSION, "r1", "issue_refund", arguments) == expected
    # Bound to every part: another session, call, tool or argument is another digest.
    others = {
        approval_digest("other", "r1", "issue_refund", arguments),
        approval_digest(SESSION, "r2", "issue_refund", arguments),
        approval_digest(SESSION, "r1", "notify", arguments),
        approval_digest(SESSION, "r1", "issue_refund", {**arguments, "amount_cents": 1501}),
    }
    assert expected not in others
    assert len(others) == 4


# -- the happy paths ----------------------------------------------------------------


async def test_a_call_needing_approval_waits_while_the_others_run(durable_store: Store) -> None:
    effects = Effects()
    writes = count_writes(durable_store)
    result = await start(writes, effects, LOOKUP, REFUND, NOTIFY)
    assert result.status == "awaiting_approval"
    assert [p.to_dict() for p in result.pending] == [
        {
            "tool_call_id": "r1",
            "tool_name": "issue_refund",
            "arguments": {"order_id": "A-1", "amount_cents": 1500},
            "digest": approval_digest(SESSION, "r1", "issue_refund", REFUND.arguments),
        }
    ]
    assert effects == {"l1": 1, "n1": 1}  # the refund did not run
    assert writes.appends == 2  # write #1 (with the request), then the others' results
    history = await durable_store.load_messages(SESSION)
    assert [m.tool_call_id for m in history if m.role == "tool"] == ["l1", "n1"]
    assert await pending_approvals(durable_store, SESSION) == result.pending


async def test_approved_it_runs_once_and_the_turn_goes_on(durable_store: Store) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, LOOKUP, REFUND)
    (pending,) = waiting.pending
    await approve(
        durable_store, SESSION, "r1", digest=pending.digest, approved=True, reason="ok by ann"
    )
    writes = count_writes(durable_store)
    llm = ScriptedLLM([reply_from_results])
    done = await resume(writes, effects, llm)
    assert done.status == "complete"
    assert effects == {"l1": 1, "r1": 1}
    assert writes.appends == 3  # the claim, the refund's result, the final reply
    assert '{"refunded_cents":1500}' in done.response
    # The model saw one result per call, the refund's after the claim, and the turn ended.
    history = await durable_store.load_messages(SESSION)
    assert [m.tool_call_id for m in history if m.role == "tool"] == ["l1", "r1"]
    assert history[-1].is_final_reply
    # A decision is final.
    with pytest.raises(ApprovalAlreadyDecidedError):
        await approve(durable_store, SESSION, "r1", digest=pending.digest, approved=False)
    # The decision is kept, with who decided (the reason); load_messages has only messages.
    events = await durable_store.load_approvals(SESSION)
    assert [(e.event, e.reason) for e in events] == [
        ("requested", None), ("approved", "ok by ann"), ("claimed", None),
    ]  # fmt: skip
    assert all(isinstance(m, Message) for m in history)


async def test_denied_the_model_sees_tool_denied_and_it_never_runs(durable_store: Store) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, REFUND)
    await approve(
        durable_store, SESSION, "r1", digest=waiting.pending[0].digest, approved=False,
        reason="over the limit",
    )  # fmt: skip
    llm = ScriptedLLM([reply_from_results])
    done = await resume(durable_store, effects, llm)
    assert done.status == "complete"
    assert "r1" not in effects
    sent = [m for m in llm.calls[0].messages if m.role == "tool"]
    (denied,) = sent
    assert json.loads(denied.content) == {
        "error": denied_text(),
        "kind": "tool-denied",
        "toolName": "issue_refund",
        "toolCallId": "r1",
        "reason": "over the limit",
    }


def denied_text() -> str:
    return (
        "The call to 'issue_refund' (call r1) was denied by a person and did not run. "
        "Do not make it again unless the user asks for it; say what was not done."
    )


async def test_the_turn_waits_until_every_call_of_the_step_is_decided(
    durable_store: Store,
) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, REFUND, REFUND_2)
    assert [p.tool_call_id for p in waiting.pending] == ["r1", "r2"]
    first, second = waiting.pending
    await approve(durable_store, SESSION, "r1", digest=first.digest, approved=True)
    still = await resume(durable_store, effects, ScriptedLLM([]))
    assert still.status == "awaiting_approval"
    assert [p.tool_call_id for p in still.pending] == ["r2"]
    assert effects == {}  # nothing runs until the step is decided
    await approve(durable_store, SESSION, "r2", digest=second.digest, approved=False)
    done = await resume(durable_store, effects)
    assert done.status == "complete"
    assert effects == {"r1": 1}


# -- refusals: nothing written ------------------------------------------------------


async def test_while_calls_wait_resume_answers_the_same_without_the_model(
    durable_store: Store,
) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, REFUND)
    writes = count_writes(durable_store)
    llm = ScriptedLLM([])  # any call would raise ScriptExhaustedError
    again = await resume(writes, effects, llm)
    assert (again.status, again.pending) == ("awaiting_approval", waiting.pending)
    assert (writes.appends, llm.calls) == (0, [])


async def test_a_new_message_while_calls_wait_is_refused(durable_store: Store) -> None:
    effects = Effects()
    await start(durable_store, effects, REFUND)
    before = await durable_store.load_messages(SESSION)
    with pytest.raises(ApprovalPendingError) as caught:
        await run(
            refund_agent(effects), llm=ScriptedLLM([]), message="and another thing",
            session_id=SESSION, store=durable_store,
        )  # fmt: skip
    assert caught.value.code == "approval-pending"
    assert caught.value.tool_call_ids == ["r1"]
    assert await durable_store.load_messages(SESSION) == before


async def test_a_wrong_digest_or_an_unknown_call_decides_nothing(durable_store: Store) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, LOOKUP, REFUND)
    other_args = approval_digest(SESSION, "r1", "issue_refund", {**REFUND.arguments, "x": 1})
    with pytest.raises(ApprovalDigestMismatchError) as mismatch:
        await approve(durable_store, SESSION, "r1", digest=other_args, approved=True)
    assert mismatch.value.code == "approval-digest-mismatch"
    for call_id in ("nope", "l1"):  # never asked; a call that needed no approval
        with pytest.raises(ApprovalNotFoundError):
            await approve(
                durable_store, SESSION, call_id, digest=waiting.pending[0].digest, approved=True
            )
    with pytest.raises(SessionNotFoundError):
        await approve(durable_store, "no-session", "r1", digest="0" * 64, approved=True)
    assert [e.event for e in await durable_store.load_approvals(SESSION)] == ["requested"]
    assert (await resume(durable_store, effects, ScriptedLLM([]))).status == "awaiting_approval"


async def test_of_racing_approvers_exactly_one_wins(durable_store: Store) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, REFUND)
    digest = waiting.pending[0].digest
    outcomes = await asyncio.gather(
        *(
            approve(durable_store, SESSION, "r1", digest=digest, approved=i % 2 == 0, reason=str(i))
            for i in range(6)
        ),
        return_exceptions=True,
    )
    assert sum(o is None for o in outcomes) == 1, outcomes
    losers = [o for o in outcomes if o is not None]
    assert all(isinstance(o, ApprovalAlreadyDecidedError) for o in losers), losers
    decisions = [e for e in await durable_store.load_approvals(SESSION) if e.event != "requested"]
    assert len(decisions) == 1


class DeletedMeanwhile:
    """A store whose session is deleted just before the decision's write lands: the
    approver loaded the waiting call, then somebody sent DELETE."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append_messages_atomic(self, session_id: str, *args: Any, **kwargs: Any) -> None:
        await self.store.delete_session(session_id)
        await self.store.append_messages_atomic(session_id, *args, **kwargs)


async def test_a_decision_on_a_deleted_session_says_the_session_is_gone(
    durable_store: Store,
) -> None:
    effects = Effects()
    waiting = await start(durable_store, effects, REFUND)
    digest = waiting.pending[0].digest
    racing: Any = DeletedMeanwhile(durable_store)
    with pytest.raises(SessionNotFoundError):
        await approve(racing, SESSION, "r1", digest=digest, approved=True)
    with pytest.raises(SessionNotFoundError):  # and after the delete, plainly
        await approve(durable_store, SESSION, "r1", digest=digest, approved=True)
    assert await durable_store.load_approvals(SESSION) == []
    assert effects == {}


async def test_invalid_arguments_are_answered_at_once_with_nothing_to_approve(
    durable_store: Store,
) -> None:
    effects = Effects()
    bad = ToolCall("r9", "issue_refund", {"order_id": "A-1", "amount_cents": "lots"})
    done = await start(durable_store, effects, bad)
    assert done.status == "complete"
    assert tool_error(done.messages[3].content)["kind"] == "invalid-arguments"  # type: ignore[index]
    assert await durable_store.load_approvals(SESSION) == []


async def test_waiting_releases_the_lease(durable_store: Store) -> None:
    await start(durable_store, Effects(), REFUND)
    assert await durable_store.acquire_lease(SESSION, "an approver's run", 60_000) is None


async def test_the_memory_store_keeps_the_same_approval_rules() -> None:
    # run() needs a durable store to continue a session; the store rules are the same.
    store = memory_store()
    effects = Effects()
    result = await run(refund_agent(effects), llm=llm_for(REFUND), message="go", store=store)
    assert result.status == "awaiting_approval"
    (pending,) = result.pending
    sid = result.session_id
    with pytest.raises(ApprovalDigestMismatchError):
        await approve(store, sid, "r1", digest="0" * 64, approved=True)
    await approve(store, sid, "r1", digest=pending.digest, approved=True)
    with pytest.raises(ApprovalAlreadyDecidedError):
        await approve(store, sid, "r1", digest=pending.digest, approved=False)


# -- crash windows ------------------------------------------------------------------


async def approved_session(store: Store, effects: Effects) -> str:
    waiting = await start(store, effects, REFUND)
    digest = waiting.pending[0].digest
    await approve(store, SESSION, "r1", digest=digest, approved=True)
    return digest


async def test_a_crash_after_the_decision_before_the_claim_runs_it_once_next_time(
    durable_store: Store,
) -> None:
    effects = Effects()
    await approved_session(durable_store, effects)
    with pytest.raises(SimulatedCrash):  # the claim never lands
        await resume(crash_on_write(durable_store, 1), effects)
    assert effects == {}
    done = await resume(durable_store, effects)
    assert done.status == "complete"
    assert effects == {"r1": 1}


@pytest.mark.parametrize(
    ("crash_on", "when", "ran"),
    [(1, "after", 0), (2, "before", 1)],
    ids=["after-the-claim", "before-the-result"],
)
async def test_a_crash_after_the_claim_is_an_orphan_never_a_second_run(
    durable_store: Store, crash_on: int, when: Any, ran: int
) -> None:
    effects = Effects()
    await approved_session(durable_store, effects)
    with pytest.raises(SimulatedCrash):
        await resume(crash_on_write(durable_store, crash_on, when=when), effects)
    assert effects.get("r1", 0) == ran
    done = await resume(durable_store, effects)
    assert done.status == "complete"
    assert effects.get("r1", 0) == ran  # never run (again)
    history = await durable_store.load_messages(SESSION)
    assert ToolDurabilityError.from_message(history[-2]) is not None


async def test_a_waiting_call_is_never_an_orphan(durable_store: Store) -> None:
    effects = Effects()
    with pytest.raises(SimulatedCrash):  # the process dies right after write #1 lands
        await start(crash_on_write(durable_store, 1, when="after"), effects, REFUND, NOTIFY)
    waiting = await resume(durable_store, effects, ScriptedLLM([]))
    assert waiting.status == "awaiting_approval"
    assert [p.tool_call_id for p in waiting.pending] == ["r1"]
    history = await durable_store.load_messages(SESSION)
    # The unsafe call that needed no approval was repaired; the waiting one was not.
    assert [m.tool_call_id for m in history if m.role == "tool"] == ["n1"]
    assert ToolDurabilityError.from_message(history[-1]) is not None


# -- the sweep: every write, approvals in the loop ---------------------------------


async def play(store: Store, effects: Effects, decision: bool) -> list[str]:
    """Start the turn, decide, finish it: (re)entered after any crash until done.
    Returns what happened, for the report."""
    log: list[str] = []
    agent = refund_agent(effects)
    script = [LLMResponse(tool_calls=[LOOKUP, REFUND, NOTIFY]), reply_from_results]
    for _ in range(12):
        try:
            history = await store.load_messages(SESSION)
            if not history:
                result = await run(
                    agent, llm=ScriptedLLM(script), message="refund", session_id=SESSION,
                    store=store,
                )  # fmt: skip
            else:
                result = await run(
                    agent, llm=ScriptedLLM([reply_from_results]), session_id=SESSION, store=store
                )
            if result.status == "complete":
                return log
            assert result.status == "awaiting_approval", result
            for pending in result.pending:
                await approve(
                    store, SESSION, pending.tool_call_id, digest=pending.digest, approved=decision
                )
                log.append(f"decided {pending.tool_call_id}")
        except SimulatedCrash as crash:
            log.append(f"crash: {crash}")
    raise AssertionError(f"the turn never finished: {log}")


async def count_appends_of_a_clean_play(tmp_path: Path, decision: bool) -> int:
    async with sqlite_store(tmp_path / "clean.db") as store:
        writes = count_writes(store)
        await play(writes, Effects(), decision)
        return writes.appends


@pytest.mark.parametrize("decision", [True, False], ids=["approved", "denied"])
async def test_every_crash_point_keeps_approvals_at_most_once(
    tmp_path: Path, decision: bool
) -> None:
    total = await count_appends_of_a_clean_play(tmp_path, decision)
    assert total == (6 if decision else 5)  # w1, w2a, decision, [claim], results, final
    points = 0
    for n in range(1, total + 1):
        for when in ("before", "after"):
            points += 1
            async with sqlite_store(tmp_path / f"{n}-{when}-{decision}.db") as store:
                effects = Effects()
                crashing = crash_on_write(store, n, when=when)  # type: ignore[arg-type]
                log = await play(crashing, effects, decision)
                history = await store.load_messages(SESSION)
                events = await store.load_approvals(SESSION)
                where = f"crash on write {n} {when}: {log}"
                # No unapproved call ever runs; an approved one at most once; unsafe ones once.
                assert effects["r1"] <= (1 if decision else 0), where
                assert effects["n1"] <= 1, where
                if effects["r1"]:
                    assert [e.event for e in events if e.tool_call_id == "r1"][-2:] == [
                        "approved", "claimed",
                    ], where  # fmt: skip
                # Every call ends with exactly one result, right after its step.
                results = Counter(m.tool_call_id for m in history if m.role == "tool")
                assert results == {"l1": 1, "r1": 1, "n1": 1}, where
                assert history[-1].is_final_reply, where
                refund = next(m for m in history if m.tool_call_id == "r1")
                kind = (tool_error(refund.content) or {}).get("kind")
                if not decision:
                    assert kind == "tool-denied", where
                elif effects["r1"] == 0:
                    assert kind == "tool-durability-error", where
    assert points == total * 2
