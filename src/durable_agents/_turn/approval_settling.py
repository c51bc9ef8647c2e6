"""The run side of approvals: which calls of a step wait for a person, and, at resume,
answering the calls that were decided.

A decided call is run only once claimed (its own write, before its handler), with
the approver's edited arguments if any; a denied one gets its `tool-denied`
result. The public side (deciding, the digest, listing what waits) is
`durable_agents.approvals`; the guide is docs/approvals.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..approvals import (
    ApprovalState,
    LastStep,
    PendingApproval,
    approval_digest,
    approval_states,
    waiting_below,
    waiting_in,
)
from ..budget import InvocationBudget
from ..errors import ApprovalPendingError, SessionBusyError, ToolArgumentsError
from ..messages import MalformedToolCall, ToolCall
from ..stores.base import ApprovalChange
from .deferral import split_to_fit
from .output_retries import OutputRetries
from .session_log import SessionLog
from .tool_execution import ToolExecutor

__all__ = ["ApprovalSettler"]


class ApprovalSettler:
    """Approvals as one run meets them: requests for a new step's calls, and settling
    the decided ones at resume."""

    def __init__(
        self,
        log: SessionLog,
        executor: ToolExecutor,
        output: OutputRetries,
        budget: InvocationBudget | None,
        max_tool_calls_per_step: int,
    ) -> None:
        self.log = log
        self.executor = executor
        self.output = output
        self.budget = budget
        self.max_tool_calls_per_step = max_tool_calls_per_step
        self.deferred_left = False  # settle() left deferred calls for another invocation

    def needing_approval(self, calls: Sequence[ToolCall]) -> dict[str, ApprovalChange]:
        """The `requested` events of the calls that wait for a person: those of tools
        declared `requires_approval` whose arguments are valid (a call that cannot
        run is answered at once, with nothing to approve)."""
        requests = {}
        for call in calls[: self.max_tool_calls_per_step]:  # the rest never run
            tool = self.executor.tools.get(call.name)
            if tool is None or not tool.requires_approval or isinstance(call, MalformedToolCall):
                continue
            try:
                tool.parse_arguments(call.arguments)
            except ToolArgumentsError:
                continue
            digest = approval_digest(self.log.session_id, call.id, call.name, call.arguments)
            requests[call.id] = ApprovalChange(call.id, "requested", digest, tool_name=call.name)
        return requests

    async def settle(self, orphans: list[ToolCall], message: str | None) -> list[PendingApproval]:
        """Answer the last step's unanswered calls, or say which wait for a decision.

        An undecided call waits (never an orphan), and so does an agent tool's call
        whose child turn has calls waiting (its child's, tagged): then only the step's
        other orphans are repaired, and the waiting calls are returned. Otherwise an
        approved, unclaimed call is claimed (one write) and run; a denied one
        gets its `tool-denied` result; a claimed one (it may have run) and a
        call that needed no approval are repaired as orphans. All of their
        results land in one write. A repaired agent tool's call whose child turn
        comes to wait (it asked for another approval) stays without a result: its
        calls are returned too, and a new `message` is refused then as well.
        """
        session_id = self.log.session_id
        store = self.log.store
        states = approval_states(await store.load_approvals(session_id))
        step = LastStep(session_id, orphans, states)
        below = await waiting_below(store, step)
        waiting = waiting_in(step, below)
        if waiting and message is not None:
            raise ApprovalPendingError(session_id, [p.tool_call_id for p in waiting])
        edits = _approved_edits(orphans, states)
        if waiting:
            return [*waiting, *await self.repair_beside_waiting(orphans, states, edits, below)]
        now_waiting = await self.answer_decided(orphans, states, edits, message)
        if now_waiting and message is not None:  # (the turn before's other calls are answered)
            raise ApprovalPendingError(session_id, [p.tool_call_id for p in now_waiting])
        return now_waiting

    async def repair_beside_waiting(
        self,
        orphans: list[ToolCall],
        states: Mapping[str, ApprovalState],
        edits: Mapping[str, dict[str, Any]],
        below: Mapping[str, list[PendingApproval]],
    ) -> list[PendingApproval]:
        """Repair the orphans of a step whose other calls wait for a decision (their own,
        or their child turn's, `below`); what waits below the repaired ones now."""
        plain = [
            c for c in orphans if (c.id not in states or states[c.id].claimed) and c.id not in below
        ]
        if not plain:
            return []
        results = await self.executor.dispatch(plain, resuming=True, edits=edits)
        if results:
            await self.log.append(results)
            self.output.answer = None  # (final_result is never answered beside waiting calls)
        return self.executor.waiting_of(plain)

    async def answer_decided(
        self,
        orphans: list[ToolCall],
        states: Mapping[str, ApprovalState],
        edits: Mapping[str, dict[str, Any]],
        message: str | None,
    ) -> list[PendingApproval]:
        """Claim and run the approved calls (those the invocation can start), answer the
        denied ones and repair the rest, in one write; what waits below the repaired
        agent tools' calls now (they get no result)."""
        decided = {
            c.id: states[c.id] for c in orphans if c.id in states and not states[c.id].claimed
        }
        runnable, later = split_to_fit(
            self.budget,
            [c for c in orphans if c.id in decided and self.may_run(c, decided[c.id])],
            self.executor.tools,
        )
        if later and message is not None:  # the turn before is not done: its calls go first
            raise SessionBusyError(
                self.log.session_id, "the turn before, running its deferred calls", 0, 0.0
            )
        if runnable:  # the claim: from here on, a crash leaves them as orphans
            claims = [ApprovalChange(c.id, "claimed", decided[c.id].digest) for c in runnable]
            await self.log.append([], approvals=claims, hold=self.executor.step_seconds(runnable))
        claimed = {c.id for c in runnable}
        # (Approved calls left for a later invocation stay as they are: no result yet.)
        answer = [c for c in orphans if c not in later]
        self.deferred_left = bool(later)
        if not answer:
            return []
        results = await self.executor.dispatch(
            answer, resuming=True, decided=decided, run=claimed, edits=edits
        )
        stored = [*results, *self.output.final_answer()]
        if stored:  # (nothing when the one call left waits for its child)
            await self.log.append(stored)
        return self.executor.waiting_of(answer)

    def may_run(self, call: ToolCall, state: ApprovalState) -> bool:
        """Whether a decided call is approved for exactly what is stored: its digest, and
        the edited arguments' own digest when the approver edited them."""
        if state.decision != "approved":
            return False
        session_id = self.log.session_id
        if approval_digest(session_id, call.id, call.name, call.arguments) != state.digest:
            return False
        if state.arguments is None:
            return True
        edited = approval_digest(session_id, call.id, call.name, state.arguments)
        return edited == state.arguments_digest


def _approved_edits(
    orphans: Sequence[ToolCall], states: Mapping[str, ApprovalState]
) -> dict[str, dict[str, Any]]:
    """The approvers' edits of `orphans`. An edit goes with its call wherever it is
    answered: run (a claimed safe orphan runs again with it) or lost (the model is
    told what was approved)."""
    return {
        c.id: state.arguments
        for c in orphans
        if (state := states.get(c.id)) is not None
        and state.decision == "approved"
        and state.arguments is not None
    }
