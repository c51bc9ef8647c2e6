"""How the check decides the calls that wait for approval: the sweeps `decide=` asks for
(approve, deny, edit, or the caller's own `decide(pending)`), the edited arguments of the
edit sweep, and the decisions written with `approve()`, as a person would. The choices:
docs/testing.md ("`check_agent`: any agent at every crash point")."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..._schema.formats import Steer
from ..._schema.values import variant_arguments
from ...agent import Agent
from ...approvals import PendingApproval, approve, pending_approvals
from ...errors import ConfigurationError, ToolArgumentsError
from ...messages import Message, ToolCall
from ...run import pending_tool_calls
from ...stores.base import Store
from ..crash_points import SimulatedCrash
from ._rules import ToolRules, is_models_own
from ._scenario import Scenario

Decision = bool | Mapping[str, Any]
"""What `decide` answers for a waiting call: approve (True), deny (False), or approve with
these arguments instead of the model's (a dict)."""
Decide = Callable[[PendingApproval], Decision]
DecidePolicy = Literal["all", "approve", "deny", "edit", "both"] | Decide
Decider = Decide | Literal["edit"]
"""One sweep's decision per waiting call: a `Decide`, or "edit" (`ArgumentEditor`)."""
_EDIT_VARIANTS = 8  # other values tried per field for decide="edit"


def sweeps(gated: bool, decide: DecidePolicy) -> list[tuple[str, Decider]]:
    """The sweeps to run: (name, decision per waiting call). "all" sweeps approving every
    call, denying every call and approving every call with edited arguments, "both" the
    first two, when the agent has a tool that needs approval (else one sweep)."""
    if callable(decide):
        return [("decide", decide)]
    approve_all: Decide = lambda pending: True  # noqa: E731
    deny_all: Decide = lambda pending: False  # noqa: E731
    named: dict[str, list[tuple[str, Decider]]] = {
        "approve": [("approve", approve_all)],
        "deny": [("deny", deny_all)],
        "edit": [("edit", "edit")],
        "both": [("approve", approve_all), ("deny", deny_all)],
        "all": [("approve", approve_all), ("deny", deny_all), ("edit", "edit")],
    }
    if decide not in named:
        raise ConfigurationError(
            "decide= must be 'all', 'approve', 'deny', 'edit', 'both' or a callable, got "
            f"{decide!r}"
        )
    if decide in ("both", "all") and not gated:
        return named["approve"]
    return named[decide]


class ArgumentEditor:
    """An approver's edits for decide="edit", made once per call (the same call made again
    gets the same edit)."""

    def __init__(
        self,
        rules: ToolRules,
        steers: Mapping[str, Steer] | None = None,
        now: datetime.datetime | None = None,
    ) -> None:
        self.rules = rules
        self.steers = steers  # values=: the edits' values of a steered format, as TestLLM's
        self.now = now
        self.edits: dict[str, dict[str, Any] | None] = {}

    def edit_for(self, call: ToolCall) -> dict[str, Any] | None:
        """An approver's edit of `call`: arguments made from the tool's input schema as
        TestLLM makes them, but another value of each field (the first variant that fits
        the schema, the tool's model, and differs from the model's arguments). None when
        the schema allows no other arguments."""
        made = json.dumps([call.name, call.arguments], sort_keys=True)
        if made not in self.edits:
            self.edits[made] = self._first_fitting_variant(call)
        return copy.deepcopy(self.edits[made])

    def _first_fitting_variant(self, call: ToolCall) -> dict[str, Any] | None:
        checker = self.rules.checking(call)
        schema = checker.input_schema
        for variant in range(1, _EDIT_VARIANTS + 1):
            value = variant_arguments(schema, variant, steers=self.steers, now=self.now)
            if not isinstance(value, dict) or value == call.arguments:
                continue
            try:
                checker.parse_arguments(value)
            except ToolArgumentsError:
                continue
            return value
        return None


def decision_of(
    decide: Decider, editor: ArgumentEditor, call: ToolCall, pending: PendingApproval
) -> tuple[bool, dict[str, Any] | None]:
    """(approved, edited arguments or None) for a waiting call, as `decide` says."""
    if decide == "edit":
        decision: Any = editor.edit_for(call)
        decision = True if decision is None else decision  # no other arguments fit
    else:
        decision = decide(pending)
    if isinstance(decision, Mapping):
        return True, copy.deepcopy(dict(decision))
    if isinstance(decision, bool):
        return decision, None
    raise ConfigurationError(
        f"decide() must return True, False or a dict of edited arguments; for "
        f"{call.name}#{call.id} it returned {type(decision).__name__}"
    )


Breach = Callable[[Scenario, str, list[Message]], AssertionError]


@dataclass(frozen=True, slots=True)
class Approver:
    """What deciding the waiting calls of one session takes: the edits of its agent's tools
    (decide="edit") and that agent, which `approve()` checks an edit against."""

    editor: ArgumentEditor
    agent: Agent[Any, Any]


async def decide_waiting(
    store: Store,
    target: Store,
    scenario: Scenario,
    decide: Decider,
    approvers: Mapping[str | None, Approver],
    breach: Breach,
) -> Literal["crashed", "decided"]:
    """Decide every call `pending_approvals` lists from the scenario's session (its own,
    then its child agents' calls) with `approve()` on that session, as a person deciding
    from the parent would, on `target` (the crashing store until the crash: a decision
    is an append, and a crash point; a child's lands in the child's session); "crashed"
    if one of those writes crashed. `approvers`: by `PendingApproval.session` (None: the
    scenario's own). `store` is read; `breach` makes a failure."""
    session_id = scenario.name
    histories: dict[str, list[Message]] = {}
    for pending in await pending_approvals(store, session_id):
        holder = pending.session or session_id
        if holder not in histories:
            histories[holder] = await store.load_messages(holder)
        call = next(
            c for c in pending_tool_calls(histories[holder]) if c.id == pending.tool_call_id
        )
        approver = approvers.get(pending.session)
        if approver is None:
            raise breach(
                scenario,
                f"pending_approvals() listed {call.name}#{call.id} in session {holder!r}, "
                "which no stored call of an agent tool of the checked agent ran",
                await store.load_messages(session_id),
            )
        approved, edit = decision_of(decide, approver.editor, call, pending)
        decided = scenario if pending.session is None else scenario.child(pending.session)
        decided.decisions[call.id] = approved
        if edit is not None and not is_models_own(holder, call, edit):
            decided.edits[call.id] = edit
        verdict = "approved" if approved else "denied"
        try:
            await approve(
                target,
                session_id,
                call.id,
                digest=pending.digest,
                approved=approved,
                reason=f"check_agent: {verdict}{' with an edit' if edit else ''}",
                arguments=edit,
                agent=approver.agent,
            )
        except SimulatedCrash:
            scenario.crashed = True
            return "crashed"
        except ToolArgumentsError as exc:
            raise ConfigurationError(
                f"decide= gave arguments for {call.name}#{call.id} that do not fit its "
                f"input schema: {exc}"
            ) from exc
        except Exception as exc:
            raise breach(
                scenario,
                f"approve() of {call.name}#{call.id} raised {type(exc).__name__}: {exc}",
                await store.load_messages(session_id),
            ) from exc
    return "decided"
