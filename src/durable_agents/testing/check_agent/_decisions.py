"""How the check decides the calls that wait for approval: the sweeps `decide=` asks for
(approve, deny, edit, or the caller's own `decide(pending)`), and the edited arguments of
the edit sweep. docs/testing.md ("`check_agent`: any agent at every crash point") lists
the choices."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ...approvals import PendingApproval
from ...errors import ConfigurationError, ToolArgumentsError
from ...llm._schema_values import _Maker, _NoVariant, _Unfillable
from ...messages import ToolCall
from ._rules import ToolRules

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

    def __init__(self, rules: ToolRules) -> None:
        self.rules = rules
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
        maker = _Maker(schema)
        for variant in range(1, _EDIT_VARIANTS + 1):
            try:
                value = maker.value(schema, "$", variant)
            except (_Unfillable, _NoVariant):
                continue
            if not isinstance(value, dict) or value == call.arguments:
                continue
            if maker.problems(value, schema, "$"):
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
