"""Deferring a step's tool calls to a fresh Workers invocation.

Inside a Workers invocation a step's calls that its budget cannot start
(`durable_agents.budget`) are not run: they are recorded as requested and
approved by the kit, so the run that picks them up claims each before it starts
it, as a person's approved call. The guide: docs/limits.md (Invocation budgets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..approvals import approval_digest
from ..budget import InvocationBudget
from ..messages import MalformedToolCall, ToolCall
from ..stores.base import ApprovalChange
from ..tools import Tool

__all__ = ["DEFERRED_REASON", "deferral_events", "split_to_fit"]

# The reason stored with a call the kit deferred to a fresh Workers invocation.
DEFERRED_REASON = (
    "deferred by durable-agents: over what this Workers invocation may still fetch; "
    "it runs in the next invocation"
)


def split_to_fit(
    budget: InvocationBudget | None, calls: Sequence[ToolCall], tools: Mapping[str, Tool]
) -> tuple[list[ToolCall], list[ToolCall]]:
    """`calls` as (run now, defer): in a Workers invocation, the calls whose handlers
    its budget cannot start are deferred (a call that runs no handler never is)."""
    if budget is None:
        return list(calls), []
    room = budget.calls_that_fit()
    now: list[ToolCall] = []
    later: list[ToolCall] = []
    for call in calls:
        runs = not isinstance(call, MalformedToolCall) and call.name in tools
        if runs and room <= 0:
            later.append(call)
            continue
        room -= runs
        now.append(call)
    return now, later


def deferral_events(session_id: str, calls: Sequence[ToolCall]) -> list[ApprovalChange]:
    """The events recording `calls` as deferred: requested and approved by the kit, so
    a later run claims each before it starts it, as an approved call: a deferred call
    without a claim is known never to have started."""
    if not calls:
        return []  # (every step that ran all its calls)
    digests = [approval_digest(session_id, c.id, c.name, c.arguments) for c in calls]
    # Requests first, then decisions: two runs, each one packed statement for D1.
    return [
        *(
            ApprovalChange(c.id, "requested", d, tool_name=c.name)
            for c, d in zip(calls, digests, strict=True)
        ),
        *(
            ApprovalChange(c.id, "approved", d, reason=DEFERRED_REASON)
            for c, d in zip(calls, digests, strict=True)
        ),
    ]
