"""Edited approvals (`approve(..., arguments=...)`): the approver's edit is checked against
the tool's input schema, then stored with the decision, as sent, with its own digest.
Here the decision side only, on every CPython store: the session is written as write #1
of a step leaves it (the call, its `requested` event), decided with `approve()`, and
read back. That the call then runs once with the edit is the run loop's (test_approvals.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ApprovalDigestMismatchError,
    ConfigurationError,
    Message,
    ToolArgumentsError,
    ToolCall,
    approval_digest,
    approve,
    pending_approvals,
    tool,
)
from durable_agents.approvals import approval_states
from durable_agents.stores import Store
from durable_agents.stores.base import ApprovalChange

SESSION = "s"


class Refund(BaseModel):
    order_id: str
    amount_cents: int


@tool(requires_approval=True)
async def issue_refund(args: Refund) -> dict[str, int]:
    """Refund an order."""
    return {"refunded_cents": args.amount_cents}


AGENT = Agent("refunds", "Refund what is asked.", [issue_refund])
REFUND = ToolCall("r1", "issue_refund", {"order_id": "A-1", "amount_cents": 1500})

NOTE_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "pinned": {"type": "boolean"}},
    "required": ["title"],
    "additionalProperties": False,
}
ADD_NOTE = ToolCall(
    "n1", "add_note", {"title": "draft"},
    policy={"source": "mcp:notes", "safe_to_retry": False, "requires_approval": True,
            "annotations": {}, "input_schema": NOTE_SCHEMA},
)  # fmt: skip


def nested(depth: int) -> list[Any]:
    """A list `depth` levels deep: past what the kit stores (`_json.MAX_DEPTH`, 128)."""
    outer: list[Any] = []
    level = outer
    for _ in range(depth - 1):
        level.append([])
        level = level[0]
    return outer


async def waiting(store: Store, call: ToolCall) -> str:
    """The session as write #1 of a step that asks for `call` leaves it; its digest."""
    digest = approval_digest(SESSION, call.id, call.name, call.arguments)
    request = ApprovalChange(call.id, "requested", digest, tool_name=call.name)
    await store.append_messages_atomic(
        SESSION, 0, [Message.user("go"), Message.assistant("", [call])], approvals=[request]
    )
    return digest


async def decisions(store: Store) -> list[tuple[str, Any, str | None]]:
    return [
        (e.event, e.arguments, e.arguments_digest)
        for e in await store.load_approvals(SESSION)
        if e.event != "requested"
    ]


async def test_an_edit_is_stored_with_the_approval_and_its_own_digest(any_store: Store) -> None:
    digest = await waiting(any_store, REFUND)
    edit = {"amount_cents": 500, "order_id": "A-1"}  # another order of keys: kept
    await approve(
        any_store, SESSION, "r1", digest=digest, approved=True, reason="ann: half",
        arguments=edit, agent=AGENT,
    )  # fmt: skip
    events = await any_store.load_approvals(SESSION)
    assert [(e.event, e.digest, e.reason) for e in events] == [
        ("requested", digest, None),
        ("approved", digest, "ann: half"),  # bound to the call the approver was shown
    ]
    approved = events[1]
    assert approved.arguments == edit
    assert approved.arguments is not None
    assert list(approved.arguments) == ["amount_cents", "order_id"]
    assert approved.arguments_digest == approval_digest(SESSION, "r1", "issue_refund", edit)
    assert approved.arguments_digest != digest
    state = approval_states(events)["r1"]
    assert (state.decision, state.arguments, state.arguments_digest) == (
        "approved", edit, approved.arguments_digest,
    )  # fmt: skip
    assert await pending_approvals(any_store, SESSION) == []
    # The stored call is the model's, unchanged: both versions are kept.
    assert (await any_store.load_messages(SESSION))[1].tool_calls == (REFUND,)


async def test_an_edit_equal_to_the_models_arguments_is_a_plain_approval(
    any_store: Store,
) -> None:
    digest = await waiting(any_store, REFUND)
    same = {"amount_cents": 1500, "order_id": "A-1"}  # keys in another order: the same digest
    await approve(any_store, SESSION, "r1", digest=digest, approved=True, arguments=same,
                  agent=AGENT)  # fmt: skip
    assert await decisions(any_store) == [("approved", None, None)]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"order_id": "A-1", "amount_cents": "lots"}, "amount_cents"),
        ({"order_id": "A-1"}, "amount_cents"),
        (["A-1", 500], "must be a JSON object"),
        ({"order_id": "A-1", "amount_cents": float("nan")}, "must be JSON"),
        ({"order_id": "A-1", "amount_cents": 5, "deep": nested(200)}, "must be JSON"),
    ],
)
async def test_an_edit_that_does_not_fit_the_schema_decides_nothing(
    any_store: Store, edit: Any, problem: str
) -> None:
    digest = await waiting(any_store, REFUND)
    with pytest.raises(ToolArgumentsError, match=problem) as refused:
        await approve(any_store, SESSION, "r1", digest=digest, approved=True, arguments=edit,
                      agent=AGENT)  # fmt: skip
    assert refused.value.code == "invalid-arguments"
    assert refused.value.tool_name == "issue_refund"
    assert await decisions(any_store) == []
    assert [p.tool_call_id for p in await pending_approvals(any_store, SESSION)] == ["r1"]


async def test_only_an_approval_carries_an_edit_and_the_digest_is_checked_first(
    any_store: Store,
) -> None:
    digest = await waiting(any_store, REFUND)
    with pytest.raises(ConfigurationError, match="only an approval carries edited arguments"):
        await approve(any_store, SESSION, "r1", digest=digest, approved=False,
                      arguments={"order_id": "A-1", "amount_cents": 1}, agent=AGENT)  # fmt: skip
    bad = {"order_id": "A-1", "amount_cents": "bad"}
    with pytest.raises(ApprovalDigestMismatchError):
        await approve(any_store, SESSION, "r1", digest="0" * 64, approved=True, arguments=bad,
                      agent=AGENT)  # fmt: skip
    assert await decisions(any_store) == []


async def test_an_edit_of_the_agents_own_tool_needs_that_agent(any_store: Store) -> None:
    digest = await waiting(any_store, REFUND)
    edit = {"order_id": "A-1", "amount_cents": 500}
    with pytest.raises(ConfigurationError, match="needs agent="):
        await approve(any_store, SESSION, "r1", digest=digest, approved=True, arguments=edit)
    stranger = Agent("other", "Other.", [])
    with pytest.raises(ConfigurationError, match="has no tool 'issue_refund'"):
        await approve(any_store, SESSION, "r1", digest=digest, approved=True, arguments=edit,
                      agent=stranger)  # fmt: skip
    assert await decisions(any_store) == []
    # Without an edit no agent is needed, as before.
    await approve(any_store, SESSION, "r1", digest=digest, approved=True)
    assert await decisions(any_store) == [("approved", None, None)]


async def test_a_toolset_calls_edit_is_checked_against_the_schema_stored_with_it(
    any_store: Store,
) -> None:
    digest = await waiting(any_store, ADD_NOTE)
    for bad, problem in (
        ({"title": 5}, r"arguments\.title: expected string, got integer"),
        ({"title": "x", "color": "red"}, r"arguments\.color: not allowed"),
        ({"pinned": True}, r"arguments\.title: required"),
    ):
        with pytest.raises(ToolArgumentsError, match=problem):
            await approve(any_store, SESSION, "n1", digest=digest, approved=True, arguments=bad)

    # The stored schema decides, not a tool of that name the agent may have today.
    @tool
    async def add_note(args: Refund) -> str:
        """Another tool of the same name."""
        return "x"

    edit = {"title": "final", "pinned": True}
    await approve(any_store, SESSION, "n1", digest=digest, approved=True, arguments=edit,
                  agent=Agent("notes", "Notes.", [add_note]))  # fmt: skip
    assert await decisions(any_store) == [
        ("approved", edit, approval_digest(SESSION, "n1", "add_note", edit))
    ]
