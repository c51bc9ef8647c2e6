"""The approval rules: no call of a tool that needs approval ran without a stored, claimed
approval of that exact call; an approved one ran at most once, a denied one never; an
edited one ran with the approver's arguments only. docs/testing.md ("`check_agent`: any
agent at every crash point") says how the check decides the waiting calls."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ...approvals import ApprovalState, approval_digest
from ...errors import ToolDurabilityError
from ...messages import Message, ToolCall, ToolErrorKind, tool_error
from ._check_calls import HANDLER_NOT_CALLED
from ._check_history import stored_calls, stored_results
from ._jsonrpc import json_value
from ._report import Tally
from ._rules import ToolRules, plain
from ._scenario import Invocation, Scenario


def assert_approvals(
    scenario: Scenario,
    history: Sequence[Message],
    states: Mapping[str, ApprovalState],
    rules: ToolRules,
    tally: Tally,
) -> None:
    """No call of a requires_approval tool ran without a stored approval of that exact
    call (claimed before it ran); an approved one ran at most once; a denied one never
    ran and was answered `tool-denied`; an edited one ran with the edit only."""
    calls = stored_calls(history)
    results = stored_results(history)
    for invocation in scenario.invocations:
        _assert_ran_approved(scenario, invocation, calls.get(invocation.call_id), rules)
    runs = Counter(i.call_id for i in scenario.invocations)
    for call_id, call in calls.items():
        call_rules = rules.of(call)
        if call_rules is None or not call_rules.requires_approval:
            continue
        state = states.get(call_id)
        result = results[call_id]
        if state is None:  # answered at once: a call that could not run
            kind = _error_kind(result)
            assert kind in HANDLER_NOT_CALLED - {ToolErrorKind.TOOL_DENIED}, (
                f"call {call.name}#{call_id} of a requires_approval tool has no approval "
                f"request stored, and its result is {kind or 'a result'}"
            )
            continue
        if call_id in scenario.decisions:
            want = "approved" if scenario.decisions[call_id] else "denied"
            assert state.decision == want, (
                f"call {call.name}#{call_id} was {want} with approve(); the store says "
                f"{state.decision}"
            )
        if state.decision == "denied":
            tally.denied += 1
            _assert_denied(call, result, runs[call_id])
            continue
        assert state.decision == "approved", (
            f"call {call.name}#{call_id} has a result but no decision was stored"
        )
        tally.approved += 1
        _assert_approved(call, state, result, runs[call_id], call_rules.safe_to_retry)
        lost = ToolDurabilityError.from_message(result) is not None
        _assert_edit(scenario, call, state, result, lost, rules, tally)


def _error_kind(result: Message) -> object:
    """The `kind` of a tool error result, or None for a result of a handler."""
    error = tool_error(result.content)
    return error.get("kind") if error else None


def _assert_ran_approved(
    scenario: Scenario, invocation: Invocation, call: ToolCall | None, rules: ToolRules
) -> None:
    """A handler run of a gated tool had the store's claimed approval of its exact call."""
    # (For no stored call, by the tool that ran: assert_calls says it ran for none.)
    call_rules = rules.of(call) if call is not None else rules.of_tool(invocation.tool_name)
    if call_rules is None or not call_rules.requires_approval:
        return
    state = invocation.approval
    where = f"{invocation.tool_name}#{invocation.call_id} (run {invocation.run_number})"
    had = "no approval request" if state is None else state.decision
    unapproved = f"requires_approval tool {where} ran without a stored approval"
    assert state is not None, f"{unapproved} (the store had: {had})"
    assert state.decision == "approved", f"{unapproved} (the store had: {had})"
    assert state.claimed, f"approved call {where} ran before its claim was stored"
    if call is not None:
        digest = approval_digest(scenario.name, call.id, call.name, call.arguments)
        assert digest == state.digest, (
            f"approved call {where} ran with arguments other than the approved ones"
        )


def _assert_denied(call: ToolCall, result: Message, runs: int) -> None:
    assert runs == 0, f"denied call {call.name}#{call.id} ran {runs} time(s)"
    kind = _error_kind(result)
    assert kind == ToolErrorKind.TOOL_DENIED, (
        f"denied call {call.name}#{call.id} got {kind or 'a result'}, not tool-denied"
    )


def _assert_approved(
    call: ToolCall, state: ApprovalState, result: Message, runs: int, safe: bool
) -> None:
    """An approved call ran at most once (a safe one may run again), was not answered
    tool-denied once it ran, and lost its result only once claimed."""
    if not safe:
        assert runs <= 1, f"approved call {call.name}#{call.id} ran {runs} times"
    assert _error_kind(result) != ToolErrorKind.TOOL_DENIED or runs == 0, (
        f"approved call {call.name}#{call.id} ran and was answered tool-denied"
    )
    if ToolDurabilityError.from_message(result) is not None:
        assert state.claimed, (
            f"call {call.name}#{call.id} got a tool-durability-error though it was "
            "never claimed (an unclaimed approved call never ran: it must run)"
        )


def _assert_edit(
    scenario: Scenario,
    call: ToolCall,
    state: ApprovalState,
    result: Message,
    lost: bool,
    rules: ToolRules,
    tally: Tally,
) -> None:
    """An approval with edited arguments: stored with the edit as sent and its digest;
    every run of the call's handler had the edit (never the model's arguments); a result
    of a run says so, with the edit."""
    where = f"{call.name}#{call.id}"
    sent = scenario.edits.get(call.id)
    if sent is not None:
        assert state.arguments == sent, (
            f"call {where} was approved with edited arguments {sent!r}; the stored "
            f"approval has {state.arguments!r}"
        )
    if state.arguments is None:
        return
    tally.edited += 1
    assert state.arguments_digest == approval_digest(
        scenario.name, call.id, call.name, state.arguments
    ), f"the edited approval of {where} is stored with a digest that is not its edit's"
    _assert_ran_with_the_edit(scenario, call, state.arguments, rules)
    ran = any(i.call_id == call.id for i in scenario.invocations)
    if ran and not lost:
        content = json_value(result.content)
        said = content.get("edited_arguments") if isinstance(content, dict) else None
        assert said == state.arguments, (
            f"the result of {where}, which ran with an approver's edit, does not say so "
            f"(edited_arguments {state.arguments!r}): {result.content[:200]!r}"
        )


def _assert_ran_with_the_edit(
    scenario: Scenario, call: ToolCall, edit: object, rules: ToolRules
) -> None:
    checker = rules.checking(call)
    wanted = plain(checker.parse_arguments(edit))
    models = plain(checker.parse_arguments(call.arguments))
    for invocation in scenario.invocations:
        if invocation.call_id != call.id or invocation.arguments == wanted:
            continue
        which = "the model's arguments" if invocation.arguments == models else "other arguments"
        raise AssertionError(
            f"approved call {call.name}#{call.id} (run {invocation.run_number}) ran with "
            f"{which}, not the approver's edit: {invocation.arguments!r}, where the edit "
            f"is {wanted!r}"
        )
