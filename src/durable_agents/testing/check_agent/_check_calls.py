"""The at-most-once rules for every stored call: an unsafe call ran at most once (and each
tool at most once a turn), a safe one re-sent no side effect without its idempotency key,
and a result a crash lost is answered as the call's rules say. The rules are listed in
docs/testing.md ("`check_agent`: any agent at every crash point")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ...errors import ToolDurabilityError
from ...messages import Message, ToolCall, ToolErrorKind, tool_error
from ._breach import AgentBreach
from ._check_history import stored_calls, stored_results
from ._jsonrpc import json_rpc
from ._report import Tally
from ._rules import ToolRules
from ._scenario import Scenario

NON_IDEMPOTENT = frozenset({"POST", "PATCH"})
HANDLER_NOT_CALLED = frozenset(
    {ToolErrorKind.INVALID_ARGUMENTS, ToolErrorKind.UNKNOWN_TOOL, ToolErrorKind.TOOL_DENIED}
)
"""The errors the kit answers a call with without running its handler."""


def assert_calls(
    scenario: Scenario, history: Sequence[Message], rules: ToolRules, tally: Tally
) -> None:
    """Every handler run was for a stored call; an unsafe tool ran at most once a turn;
    each stored call ran, or was answered, as its rules allow."""
    calls = stored_calls(history)
    results = stored_results(history)
    runs = Counter(i.call_id for i in scenario.invocations)
    for invocation in scenario.invocations:
        call = calls.get(invocation.call_id)
        stored_as = call.name if call is not None else None
        assert stored_as == invocation.tool_name, (
            f"the handler of {invocation.tool_name!r} ran for call {invocation.call_id!r}, "
            "which the history does not store: a call must be stored before it runs"
        )
    _assert_unsafe_once_a_turn(scenario, rules.safe_by_name(history))
    for call_id, call in calls.items():
        _assert_answered(scenario, call, results[call_id], runs[call_id], rules, tally)


def _assert_unsafe_once_a_turn(scenario: Scenario, safe_by_name: dict[str, bool]) -> None:
    per_turn = Counter((i.turn, i.tool_name) for i in scenario.invocations)
    for (turn, name), count in per_turn.items():
        if not safe_by_name.get(name, False):
            assert count <= 1, (
                f"unsafe tool {name!r} ran {count} times in turn {turn + 1} (TestLLM calls "
                "it once a turn: a stored call was lost and the call made again). Its "
                f"requests: {scenario.requests_of(name, turn)}"
            )


def _assert_answered(
    scenario: Scenario,
    call: ToolCall,
    result: Message,
    n: int,
    rules: ToolRules,
    tally: Tally,
) -> None:
    """Call `call`, run `n` times, and its stored `result` fit its rules."""
    error = tool_error(result.content)
    # (A handler may answer invalid-arguments itself, e.g. an MCP server's -32602:
    # then it ran, and is checked as any call that ran.)
    not_run = error is not None and error.get("kind") in HANDLER_NOT_CALLED and n == 0
    call_rules = rules.of(call)
    if call_rules is None or not_run:
        return
    durability = ToolDurabilityError.from_message(result)
    if durability is not None:
        tally.durability_errors += 1
        _assert_durability_error(call, durability, call_rules.safe_to_retry)
    if call_rules.safe_to_retry:
        assert n >= 1, f"safe call {call.name}#{call.id} has a result but never ran"
        if n > 1:
            tally.safe_reinvocations += n - 1
            assert_keyed(scenario, call.id)
        return
    _assert_unsafe(scenario, call, durability, n, tally)


def _assert_durability_error(call: ToolCall, durability: ToolDurabilityError, safe: bool) -> None:
    assert not safe, (
        f"call {call.name}#{call.id} of a safe_to_retry tool got a "
        "tool-durability-error: a safe orphan must be run again"
    )
    assert (durability.tool_name, durability.tool_call_id) == (call.name, call.id), (
        f"the durability error answering {call.name}#{call.id} names "
        f"{durability.tool_name}#{durability.tool_call_id}"
    )


def _assert_unsafe(
    scenario: Scenario,
    call: ToolCall,
    durability: ToolDurabilityError | None,
    n: int,
    tally: Tally,
) -> None:
    """An unsafe call ran at most once; a lost result is a durability error, and only
    a lost one. Its requests without the call's key are noted for the report."""
    call_id = call.id
    assert n <= 1, (
        f"unsafe call {call.name}#{call_id} ran {n} times; its requests: "
        f"{[str(r) for r in scenario.requests if r.tool_call_id == call_id]}"
    )
    if call_id in scenario.orphaned:
        assert durability is not None, (
            f"unsafe call {call.name}#{call_id} lost its result in a crash but its "
            "stored result is not a tool-durability-error"
        )
    elif durability is None:
        assert n == 1, (
            f"unsafe call {call.name}#{call_id} has a result of its own but its handler never ran"
        )
    for request in scenario.requests:
        if request.tool_call_id == call_id and not request.carries(
            request.idempotency_key or "\x00"
        ):
            tally.unkeyed.add(f"{call.name}: {request.method} {request.url}")


def assert_keyed(scenario: Scenario, call_id: str) -> None:
    """A safe call that ran again re-sent each POST/PATCH with its idempotency key."""
    sent = [r for r in scenario.requests if r.tool_call_id == call_id]
    for request in sent:
        if json_rpc(request.body) is not None and request.forwarded:
            continue  # an MCP server's: judged by what it says of the tool (_check_server_calls)
        if request.method in NON_IDEMPOTENT and not request.carries(
            request.idempotency_key or "\x00"
        ):
            raise AgentBreach(
                f"tool {request.tool_name!r} is declared safe_to_retry, so the kit ran "
                f"call {call_id!r} again after a crash, and it re-sent {request.method} "
                f"{request.url} without its idempotency key in a header: the "
                "re-invocation repeats that side effect. "
                "Send ctx.idempotency_key (e.g. an Idempotency-Key header) to a server "
                "that deduplicates by it, or drop safe_to_retry. Requests of the call: "
                f"{[str(r) for r in sent]}"
            )
