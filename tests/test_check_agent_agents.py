"""`check_agent(agents=)`: an agent whose agent tools call other agents, swept at every write
of the parent's turns and of the child turns together (a crash in a child's write kills the
parent's run too), resumed as a caller would, each call's child turn checked: it ran once,
its side effects at most once, and the parent's call got its answer. The mutation tests
break the child's exactly-once and assert the check notices."""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ConfigurationError,
    LocalAgent,
    PendingApproval,
    ToolContext,
    agent_tool,
    tool,
)
from durable_agents.messages import Message, ToolCall
from durable_agents.stores.base import ApprovalChange
from durable_agents.testing import check_agent
from durable_agents.testing.check_agent._scenario import append_labels


class Order(BaseModel):
    order: str


REFUNDED: list[str] = []


@tool
async def refund(args: Order, ctx: ToolContext) -> str:
    """Refund an order: a side effect."""
    REFUNDED.append(ctx.idempotency_key)
    return f"refunded {args.order}"


@tool(safe_to_retry=True)
async def look_up(args: Order, ctx: ToolContext) -> str:
    """Read an order."""
    return f"order {args.order}: paid"


REFUNDS = Agent("refunds", "You refund orders.", [refund])


def support_module(*tools: Any) -> ModuleType:
    module = ModuleType("support_agent")
    module.AGENT = Agent(  # type: ignore[attr-defined]
        "support", "You help.", [agent_tool("refunds", description="Refunds orders."), *tools]
    )
    module.make_deps = lambda env, http: None  # type: ignore[attr-defined]
    return module


def test_sweeps_the_parents_and_the_childs_writes_together() -> None:
    report = check_agent(support_module(look_up), config=None, agents={"refunds": REFUNDS})
    assert report.agents == ("refunds",)
    # Per turn, all at once: the parent's write #1, then the child's three (its write #1,
    # the refund's result, its reply), the parent's results and reply: 6 appends; one tool
    # a step: 8 (the look_up's step adds two). Two turns, x2 sides.
    assert report.crash_points == (6 + 8) * 2 * 2
    assert report.child_crash_points == 3 * 2 * 2 * 2
    assert report.child_turns > 0
    child = report.tools["refunds.refund"]
    assert not child.safe_to_retry
    assert child.completed > 0
    assert child.calls == report.child_turns  # TestLLM calls it once a child turn
    assert report.tools["refunds"].safe_to_retry  # the agent tool: run again after a crash
    assert report.durability_errors > 0  # the child's refunds lost mid-call, not run again
    text = str(report)
    assert re.search(r"\d+ child turns of refunds \(24 of the crash points in their writes\)", text)
    assert "refunds.refund" in text


def test_a_local_agent_brings_its_handlers_and_deps() -> None:
    seen: list[Any] = []

    async def refund_noting_deps(args: Order, ctx: ToolContext) -> str:
        seen.append(ctx.deps)
        return "refunded"

    local = LocalAgent(REFUNDS, deps="the child's deps", tools={"refund": refund_noting_deps})
    report = check_agent(support_module(), config=None, agents={"refunds": local})
    assert report.tools["refunds.refund"].completed > 0
    assert set(seen) == {"the child's deps"}


@tool
async def record(args: Order, ctx: ToolContext) -> str:
    """Write the refund in the ledger: a side effect."""
    return "recorded"


def test_a_childs_own_agent_tools_are_swept_and_checked_too() -> None:
    refunds = Agent(
        "refunds", "You refund.", [refund, agent_tool("ledger", description="Records.")]
    )
    ledger = Agent("ledger", "You record refunds.", [record])
    report = check_agent(
        support_module(), config=None, turns=1, agents={"refunds": refunds, "ledger": ledger}
    )
    assert report.agents == ("refunds", "ledger")
    # One turn, all at once: the parent's write #1; the child's write #1; the grandchild's
    # three; the child's results and reply; the parent's result and reply: 9 appends, 6
    # of them a child's or grandchild's. One call a step: the child's step split in two,
    # 11 appends, 8 of them theirs. x2 sides.
    assert report.crash_points == (9 + 11) * 2
    assert report.child_crash_points == (6 + 8) * 2
    assert report.tools["ledger.record"].completed > 0
    assert report.tools["refunds.ledger"].safe_to_retry


def test_crash_points_in_a_child_are_named_for_it() -> None:
    call = ToolCall("c1", "refunds", {"message": "refund 1"})
    child_call = ToolCall("r1", "refund", {"order": "1"})
    appends = [
        [Message.user("hi"), Message.assistant("", [call])],
        [Message.user("refund 1"), Message.assistant("", [child_call])],
        [Message.tool_result(child_call, "ok")],
        [Message.assistant("refunded")],
        [Message.tool_result(call, "refunded"), Message.assistant("done")],
    ]
    sessions = [("p", "support"), ("sub-1", "refunds"), ("sub-1", "refunds"),
                ("sub-1", "refunds"), ("p", "support")]  # fmt: skip
    assert append_labels(appends, sessions=sessions) == [
        "turn 1 step 1 write #1: calls refunds",
        "child refunds write #1: calls refund",
        "child refunds write #2: 1 result(s)",
        "child refunds write #3: the final reply",
        "turn 1: the final reply",
    ]


def test_without_agents_it_says_to_pass_them() -> None:
    with pytest.raises(ConfigurationError, match=r"agent tools for \['refunds'\]: pass them"):
        check_agent(support_module(), config=None)


IN_THE_CHILD = r"the child session sub-\w+ of call refunds#\S+: "
GATED = Agent("refunds", "You refund.", [tool(requires_approval=True)(refund.handler)])


def test_a_childs_approvals_are_decided_from_the_parents_session_and_swept() -> None:
    asked: list[str | None] = []

    def decide(pending: PendingApproval) -> bool:
        asked.append(pending.session)
        return True

    report = check_agent(
        support_module(), config=None, turns=1, decide=decide, agents={"refunds": GATED}
    )
    # Listed from the parent's session, tagged with the child's.
    assert asked
    assert all(s is not None and s.startswith("sub-") for s in asked)
    # Per mode: the parent's write #1, the child's five (its write #1, the decision, the
    # claim, the refund's result, its reply), the parent's result, then its reply (a
    # resumed step's results are a write of their own). x2 modes, x2 sides.
    assert report.crash_points == (3 + 5) * 2 * 2
    assert report.child_crash_points == 5 * 2 * 2
    assert report.approved > 0
    assert report.tools["refunds.refund"].completed > 0
    assert report.tools["refunds.refund"].approved > 0


def test_a_childs_calls_are_approved_denied_and_edited_in_the_sweeps() -> None:
    report = check_agent(support_module(), config=None, turns=1, agents={"refunds": GATED})
    counts = report.tools["refunds.refund"]
    assert counts.approved > 0
    assert counts.denied > 0
    assert report.edited > 0  # edited against the child's tool
    assert "calls of refunds.refund: none ran unapproved" in str(report)


def test_crash_points_at_a_childs_approval_writes_are_named_for_it() -> None:
    call = ToolCall("c1", "refunds", {"message": "refund 1"})
    child_call = ToolCall("r1", "refund", {"order": "1"})
    appends = [
        [Message.user("hi"), Message.assistant("", [call])],
        [Message.user("refund 1"), Message.assistant("", [child_call])],
        [],
        [],
    ]
    approvals = [[], [], [ApprovalChange("r1", "approved", "d")],
                 [ApprovalChange("r1", "claimed", "d")]]  # fmt: skip
    sessions = [("p", "support"), ("sub-1", "refunds"), ("sub-1", None), ("sub-1", "refunds")]
    assert append_labels(appends, approvals, sessions)[2:] == [
        "child refunds write #2: approval write (approved r1)",
        "child refunds write #3: approval write (claimed r1)",
    ]


def test_fails_if_the_kit_ran_a_childs_denied_call(monkeypatch: pytest.MonkeyPatch) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def obeys_nobody(self: Any, calls: Any, **kw: Any) -> Any:
        kw["run"] = set(kw.get("decided") or {})  # every decided call runs, denied ones too
        return await dispatch(self, calls, **kw)

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", obeys_nobody)
    unapproved = r"requires_approval tool refund#\S+ \(run 1\) ran without a stored approval"
    with pytest.raises(AssertionError, match=IN_THE_CHILD + unapproved):
        check_agent(
            support_module(), config=None, turns=1, decide="deny", agents={"refunds": GATED}
        )


def test_fails_if_the_kit_ran_a_childs_approved_call_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def twice(self: Any, calls: Any, **kw: Any) -> Any:
        if kw.get("run"):  # the approved calls just claimed: dispatched twice
            await dispatch(self, calls, **kw)
        return await dispatch(self, calls, **kw)

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", twice)
    with pytest.raises(
        AssertionError, match=IN_THE_CHILD + r"approved call refund#\S+ ran 2 times"
    ):
        check_agent(
            support_module(), config=None, turns=1, decide="approve", agents={"refunds": GATED}
        )


class Catalog:
    """A toolset of the child's own (its tools listed per run)."""

    async def list_tools(self, ctx: Any) -> list[Any]:
        return []


def test_a_child_with_toolsets_is_refused_plainly() -> None:
    with_toolsets = Agent("refunds", "You refund.", [refund], toolsets=[Catalog()])
    refused = r"agent 'refunds' of agents= as a child: it has toolsets.*Check it on its own"
    with pytest.raises(ConfigurationError, match=refused):
        check_agent(support_module(), config=None, agents={"refunds": with_toolsets})


# -- agent modules in agents= -------------------------------------------------------------

POSTED: list[httpx.Request] = []


@tool
async def post_refund(args: Order, ctx: ToolContext[httpx.AsyncClient]) -> str:
    """POST the refund to the payments API (its URL the module's setting)."""
    response = await ctx.deps.post(f"{ctx.deps.base_url}refunds", json=args.model_dump(),
                                   headers={"Idempotency-Key": ctx.idempotency_key})  # fmt: skip
    return response.text


def refunds_module() -> ModuleType:
    module = ModuleType("refunds_agent")
    module.AGENT = Agent("refunds", "You refund.", [post_refund])  # type: ignore[attr-defined]

    def make_deps(env: Any, http: httpx.AsyncClient) -> httpx.AsyncClient:
        http.base_url = httpx.URL(env.PAYMENTS_URL + "/")
        return http

    def payments(method: str, path: str, body: bytes, headers: Any) -> tuple[int, Any]:
        return 200, {"refunded": path == "/refunds"}

    module.make_deps = make_deps  # type: ignore[attr-defined]
    module.DEV_STUBS = {"PAYMENTS_URL": payments}  # type: ignore[attr-defined]
    return module


def test_an_agent_module_in_agents_is_set_up_as_the_checked_one() -> None:
    researcher = ModuleType("researcher_agent")  # served beside them; no agent tool calls it
    agents = {"refunds": refunds_module(), "researcher": researcher}
    report = check_agent(
        support_module(), config=None, turns=1, env={"PAYMENTS_URL": ""}, agents=agents
    )
    assert report.agents == ("refunds",)
    assert report.requests > 0
    assert report.tools["refunds.post_refund"].completed > 0
    assert report.tools["refunds.post_refund"].failed == 0  # its dev stub answered


def test_an_agent_modules_make_deps_failing_names_it() -> None:
    module = refunds_module()
    module.DEV_STUBS = {}  # type: ignore[attr-defined]
    with pytest.raises(
        AssertionError, match=r"make_deps\(env, http\) of agents\['refunds'\] raised"
    ):
        check_agent(support_module(), config=None, turns=1, agents={"refunds": module})


def test_fails_if_a_resumed_call_starts_a_second_child_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    delegation = importlib.import_module("durable_agents._turn.delegation")
    run_turn = delegation.LocalAgents.run_turn
    runs: dict[str, int] = {}

    async def forgetful(self: Any, turn: Any) -> Any:
        n = runs[turn.request_key] = runs.get(turn.request_key, 0) + 1
        key = turn.request_key if n == 1 else f"{turn.request_key}-{n}"  # a new turn on a rerun
        return await run_turn(self, delegation.AgentTurn(
            turn.agent, turn.session_name, turn.message, key, turn.depth,
            turn.parent_session_id, turn.tool_call_id,
        ))  # fmt: skip

    monkeypatch.setattr(delegation.LocalAgents, "run_turn", forgetful)
    with pytest.raises(AssertionError) as failure:
        check_agent(support_module(), config=None, agents={"refunds": REFUNDS})
    # First found: a crash before the child's write #1, and the call run again started a
    # turn of its own key.
    assert re.search(
        r"crash before append #2 \(child refunds write #1: calls refund\).*\n.*the kit broke "
        r"a rule: the child session sub-\w+ of call refunds#\S+: its turn was started with "
        r"request key 'da-\w+-2', not the call's idempotency key",
        str(failure.value),
    )


def test_fails_if_the_parent_gets_no_answer_from_its_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    delegation = importlib.import_module("durable_agents._turn.delegation")
    answer = delegation._answer

    def lost(agent: str, name: str, outcome: Any) -> str:
        return answer(agent, name, delegation.AgentTurnOutcome(
            "error", "", outcome.usage, outcome.session_id, "lost",
        ))  # fmt: skip

    monkeypatch.setattr(delegation, "_answer", lost)
    with pytest.raises(AssertionError, match=r"answered 'agent-failed'.*not with the child's"):
        check_agent(support_module(), config=None, agents={"refunds": REFUNDS})
