"""The rules for the child sessions the agent's agent tools ran: each call's child turn ran
once (one user message, with the call's idempotency key and the call as its parent), its
history well formed, its side effects at most once (the same rules as the parent's calls,
`_check_calls`), its calls that waited for approval decided (from the parent's session)
and run as decided (`_check_approvals`), and the parent's call answered with the child's
answer (after a denial, what its model then said), never a tool-durability-error.
docs/testing.md ("Agents that call agents")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..._turn.ids import idempotency_key
from ...agent_tools import child_session_name
from ...approvals import approval_states
from ...messages import Message, ParentCall, tool_error
from ...stores.base import Store
from ._check_approvals import assert_approvals
from ._check_calls import assert_calls
from ._check_history import assert_well_formed, format_history, stored_results
from ._children import ChildAgent
from ._report import Tally
from ._scenario import Scenario


async def assert_children(
    scenario: Scenario,
    history: Sequence[Message],
    store: Store,
    children: Mapping[str, ChildAgent],
    agent_tools: Mapping[str, str],
    tally: Tally,
) -> None:
    """Every stored call of an agent tool (`agent_tools`: tool name -> agent) and the child
    session it ran (and theirs, at any depth), after the scenario's turns completed."""
    checked: set[str] = set()
    await _assert_children_of(
        scenario, scenario.name, history, store, children, agent_tools, tally, checked
    )
    strays = sorted(set(scenario.children) - checked)
    assert not strays, (
        f"handlers of child agents ran in sessions {strays}, which no stored call of an "
        "agent tool names: a child's turn must run for a stored call"
    )


async def _assert_children_of(
    scenario: Scenario,
    session_id: str,
    history: Sequence[Message],
    store: Store,
    children: Mapping[str, ChildAgent],
    agent_tools: Mapping[str, str],
    tally: Tally,
    checked: set[str],
) -> None:
    """The child sessions the agent-tool calls of session `session_id` ran."""
    results = stored_results(history)
    for call in (c for m in history for c in m.tool_calls if c.name in agent_tools):
        child = children[agent_tools[call.name]]
        session = child_session_name(session_id, call.id)
        checked.add(session)
        stored = await store.load_messages(session)
        where = f"the child session {session} of call {call.name}#{call.id}"
        played = scenario.child(session)
        states = approval_states(await store.load_approvals(session))
        try:
            _assert_one_turn(session_id, call.id, stored, str(call.arguments.get("message")))
            assert_approvals(played, stored, states, child.rules, tally)
            assert_calls(played, stored, child.rules, tally)
            _assert_answered(results.get(call.id), stored, child)
        except AssertionError as exc:
            raise type(exc)(f"{where}: {exc}\n{where}:\n{format_history(stored)}") from None
        tally.child_turns += 1
        runs = ((i.tool_name, i.outcome, i.detail) for i in played.invocations)
        tally.count_tools(runs, played.decisions, stored, rename=child.counted_as)
        await _assert_children_of(
            scenario, session, stored, store, children, child.agent_tools, tally, checked
        )


def _assert_one_turn(parent: str, call_id: str, stored: Sequence[Message], asked: str) -> None:
    """The call's child turn ran once: one user message, the call's message, started with
    the call's idempotency key, recording the call as its parent."""
    users = [m for m in stored if m.role == "user"]
    assert len(users) == 1, (
        f"{len(users)} user messages: the child's turn must run once a call (a call run "
        "again after a crash finishes or reads back the turn its key started)"
    )
    (user,) = users
    key = idempotency_key(parent, call_id)
    assert user.request_key == key, (
        f"its turn was started with request key {user.request_key!r}, not the call's "
        f"idempotency key {key!r}"
    )
    assert user.parent_call == ParentCall(parent, call_id), (
        f"its user message records {user.parent_call!r} as its parent call"
    )
    assert_well_formed(stored, [asked])


def _assert_answered(result: Message | None, stored: Sequence[Message], child: ChildAgent) -> None:
    """The parent's call got the child's answer, not an error."""
    assert result is not None, "the parent's call has no result stored"
    error = tool_error(result.content)
    assert error is None, (
        f"the parent's call was answered {error.get('kind')!r} ({error.get('error')}), not "
        "with the child's answer: an agent tool's call is safe to run again after a crash, "
        "and then reads back the child's turn"
    )
    if child.agent.output_type is None:
        reply = stored[-1].content
        assert result.content == reply, (
            f"the parent's call was answered {result.content!r}; the child's final reply "
            f"is {reply!r}"
        )
