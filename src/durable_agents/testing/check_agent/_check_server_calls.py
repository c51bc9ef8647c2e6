"""The MCP rules: each `tools/call` a toolset's server received belongs to a stored call
and reached the server once, unless the server lists its tool read-only; an edited call
sent the server the edit. docs/mcp.md and docs/testing.md describe the toolsets' side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ...approvals import ApprovalState
from ...messages import Message, ToolCall
from ...run import idempotency_key
from ...tools import Toolset
from ._breach import toolset_fault
from ._check_history import stored_calls
from ._report import Tally
from ._rules import ToolRules
from ._scenario import Scenario, ServerCall


def assert_server_calls(
    scenario: Scenario,
    history: Sequence[Message],
    states: Mapping[str, ApprovalState],
    rules: ToolRules,
    servers: Mapping[str, Toolset],
    server_tools: Mapping[tuple[str, str], dict[str, Any]],
    tally: Tally,
) -> None:
    """Each MCP call (a `tools/call` a toolset's server received) belongs to a stored
    call, and reached the server once, unless the server lists its tool read-only; an
    edited call sent the server the edit. `server_tools`: each tool's annotations, as its
    server listed them."""
    calls = stored_calls(history)
    sent = _server_calls_by_call(scenario, calls, servers)
    runs = Counter(i.call_id for i in scenario.invocations)
    for call_id, reached in sent.items():
        tally.mcp_calls += len(reached)
        call = calls[call_id]
        state = states.get(call_id)
        if state is not None and state.arguments is not None:
            for server_call in reached:
                assert server_call.arguments == state.arguments, (
                    f"approved call {call.name}#{call_id} sent the MCP server the "
                    f"arguments {server_call.arguments!r}, not the approver's edit "
                    f"{state.arguments!r}"
                )
        if len(reached) > 1:
            _assert_sent_again_only_if_read_only(
                call, reached, runs[call_id], rules, servers, server_tools
            )


def _server_calls_by_call(
    scenario: Scenario, calls: Mapping[str, ToolCall], servers: Mapping[str, Toolset]
) -> dict[str, list[ServerCall]]:
    """The MCP calls of the scenario by the stored call each belongs to (by the key in its
    `_meta`, else by the handler run that sent it)."""
    by_key = {idempotency_key(scenario.name, c.id): c.id for c in calls.values()}
    sent: dict[str, list[ServerCall]] = {}
    for server_call in scenario.server_calls:
        call_id = by_key.get(server_call.key or "") or server_call.call_id
        if call_id not in calls:
            raise toolset_fault(
                servers,
                server_call.server,
                f"a tools/call of {server_call.tool!r} reached {server_call.server} for no "
                f"stored call (its _meta key: {server_call.key!r})",
            )
        assert call_id is not None
        sent.setdefault(call_id, []).append(server_call)
    return sent


def _assert_sent_again_only_if_read_only(
    call: ToolCall,
    reached: Sequence[ServerCall],
    runs: int,
    rules: ToolRules,
    servers: Mapping[str, Toolset],
    server_tools: Mapping[tuple[str, str], dict[str, Any]],
) -> None:
    """A call that reached its server more than once (from `runs` runs of its handler):
    fine for a read the server lists read-only, else whose fault it is."""
    first = reached[0]
    server_says = server_tools.get((first.server, first.tool))
    read_only = server_says is not None and server_says.get("readOnlyHint") is True
    call_rules = rules.of(call)
    safe = call_rules is not None and call_rules.safe_to_retry
    if safe and (read_only or server_says is None):
        # A read the server calls read-only: a lost result is sent again. (Of a tool
        # whose listing the check could not read, it takes the stored policy's word.)
        return
    times = f"the MCP server at {first.server} got call {call.name}#{call.id} " + (
        f"({first.tool!r} on the server) {len(reached)} times"
    )
    if safe:
        stored = dict(call.policy or {})
        raise toolset_fault(
            servers,
            first.server,
            f"{times}: the kit sent it again after a crash because the toolset stored "
            f"{call.name!r} as safe_to_retry (with annotations "
            f"{stored.get('annotations')!r}), but the server lists it with annotations "
            f"{server_says!r}, not readOnlyHint: true. A side effect marked safe runs "
            "twice",
        )
    if runs <= 1:
        raise toolset_fault(
            servers,
            first.server,
            f"{times} from {runs} run(s) of its handler: the toolset's handler "
            "sent one call more than once (a retry of a side effect)",
        )
    raise AssertionError(f"{times}: the kit ran its handler {runs} times")
