"""The names of a store's writes ("call of TOOL", "final reply", ...): what
`crash_on_write` takes and `count_writes(store).writes` lists.

The names are tabled in docs/testing.md ("Arguments, crash points, and who broke what").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..messages import Message
from ..run import DEFERRED_REASON
from ..stores.base import ApprovalChange

WriteKind = tuple[str, str | None]
"""A name a write matches: its kind ("call", "result", "decision", "claim", "final reply")
and, but for the final reply, a tool."""

_WRITE_FORMS = (
    "'call of TOOL' (the step's write #1, storing a call of TOOL), 'result of TOOL' (a write "
    "storing a result of TOOL), 'decision on TOOL' (a person's approve() of a call of "
    "TOOL, approved or denied), 'claim of TOOL' (the write just before an approved call of "
    "TOOL runs) or 'final reply' (the write ending the turn)"
)
_WRITE_NAME = re.compile(
    r"(?:the\s+)?(?:(?P<kind>calls?\s+of|results?\s+of|decisions?\s+on|claims?\s+of)\s+"
    r"(?P<tool>[A-Za-z0-9_-]{1,64})|(?P<final>final\s+reply))"
)


@dataclass(frozen=True, slots=True)
class WriteName:
    """Which write a name means: a kind ("call", "result", "decision", "claim",
    "final reply") and, but for the final reply, a tool."""

    text: str
    kind: str
    tool: str | None

    @classmethod
    def parse(cls, text: str) -> WriteName:
        match = _WRITE_NAME.fullmatch(" ".join(str(text).split()))
        if match is None:
            raise ConfigurationError(
                f"crash_on_write: cannot tell which write {text!r} means; name one as "
                f"{_WRITE_FORMS}"
            )
        if match.group("final"):
            return cls(text, "final reply", None)
        kind = match.group("kind").split()[0].rstrip("s")
        return cls(text, kind, match.group("tool"))


def write_names(
    messages: Sequence[Message], approvals: Sequence[ApprovalChange], tool_of: dict[str, str]
) -> list[WriteKind]:
    """What one write stores, as (kind, tool) pairs: the names that match it."""
    names: list[WriteKind] = []
    for m in messages:
        names += [("call", c.name) for c in m.tool_calls]
        if m.role == "tool":
            names.append(("result", m.tool_name))
        if m.is_final_reply:
            names.append(("final reply", None))
    for change in approvals:
        if change.event in ("approved", "denied") and change.reason != DEFERRED_REASON:
            names.append(("decision", tool_of.get(change.tool_call_id)))
        elif change.event == "claimed":
            names.append(("claim", tool_of.get(change.tool_call_id)))
    return names


def write_description(
    names: Sequence[WriteKind],
    messages: Sequence[Message],
    approvals: Sequence[ApprovalChange],
) -> str:
    """A write as `writes` lists it: by the names that match it, else by what it holds."""
    text = _by_names(names)
    if text:
        return text
    held = ["a summary" if m.is_summary else f"a {m.role} message" for m in messages] + [
        f"{a.event} {a.tool_call_id}" for a in approvals
    ]
    return ", ".join(held) or "no message (schedules only)"


def _by_names(names: Sequence[WriteKind]) -> str:
    """The names, each kind once with its tools in order: "call of lookup, post; final reply"."""
    parts: dict[str, list[str]] = {}
    for kind, tool in names:
        parts.setdefault(kind, [])
        if tool is not None and tool not in parts[kind]:
            parts[kind].append(tool)
    return "; ".join(
        kind + (" of " if kind != "decision" else " on ") + ", ".join(tools) if tools else kind
        for kind, tools in parts.items()
    )
