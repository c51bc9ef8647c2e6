"""What `check_agent` saw and returns: the requests it recorded, the counts it keeps as it
checks (`Tally`), and the report made of them (`AgentCheckReport`, with a `ToolCounts` per
tool: how far its calls got). docs/testing.md ("The report: how far each tool got")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ...messages import Message, ToolErrorKind, tool_error
from ...tools import Tool
from ._jsonrpc import json_rpc, meta_key


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request a handler (or `make_deps`, or a toolset) sent through the check's `http`
    client.

    `tool_name`, `tool_call_id`, `idempotency_key` and `invocation` say which
    handler run sent it (`invocation` counts that call's runs from 1); all
    None for a request made outside any handler (a toolset listing its tools).
    `forwarded`: it went to a toolset's server, for real (docs/testing.md says when).
    """

    scenario: str
    turn: int
    tool_name: str | None
    tool_call_id: str | None
    idempotency_key: str | None
    invocation: int | None
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    forwarded: bool = False

    def carries(self, text: str) -> bool:
        """Whether `text` is one of the request's header values, or the idempotency key in
        the `_meta` of the MCP `tools/call` it is."""
        if any(text in value for _, value in self.headers):
            return True
        message = json_rpc(self.body)
        return message is not None and meta_key(message) == text

    def __str__(self) -> str:
        who = (
            f"{self.tool_name}#{self.tool_call_id} (run {self.invocation})"
            if self.tool_name
            else "outside any tool call"
        )
        body = self.body[:120].decode(errors="replace")
        to = " (forwarded)" if self.forwarded else ""
        return f"{self.method} {self.url}{to} {body!r} from {who}"


@dataclass(frozen=True, slots=True)
class ToolCounts:
    """How far one tool's calls got in `check_agent`, over all its runs (every crash
    point, both modes, every decision sweep): `report.tools["renew_loan"]`.

    `calls`: the calls TestLLM made of it, as stored. Of the runs of its
    handler: `completed` returned (its side effect done), `retried` raised
    `ModelRetry`, `failed` raised anything else or was stopped by its
    `timeout`. `rejected`: calls answered `invalid-arguments`, never run.
    `approved` and `denied`: the decisions on its calls (a tool that needs
    approval). `outcomes`: what the runs and calls that did not complete
    ended in, `(text, times)`, most frequent first (`"ModelRetry('pick a
    future date')"`, `"invalid arguments: ..."`).
    """

    name: str
    safe_to_retry: bool
    requires_approval: bool = False
    calls: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    rejected: int = 0
    approved: int = 0
    denied: int = 0
    outcomes: tuple[tuple[str, int], ...] = ()

    @property
    def runs(self) -> int:
        """The runs of its handler that ended: completed, retried or failed."""
        return self.completed + self.retried + self.failed

    def ended_in(self, limit: int = 3) -> str:
        """What its runs and calls ended in, as a failure says it: "12 runs: 12
        ModelRetry('pick a future date')"."""
        parts = [f"{times} {text}" for text, times in self.outcomes[:limit]]
        if len(self.outcomes) > limit:
            parts.append(f"{sum(n for _, n in self.outcomes[limit:])} other")
        if self.denied and not self.approved:
            parts.append(f"{self.denied} denied")
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''} of its handler"
        return f"{self.calls} calls, {runs}: " + (", ".join(parts) or "none")


@dataclass(frozen=True, slots=True)
class AgentCheckReport:
    """What `check_agent` ran. Every count is over all crash points and both modes.

    `mcp_calls` counts the `tools/call` requests that reached a toolset's
    server; `edited` the approved calls that ran (or were lost) with an
    approver's edited arguments. `tools`: each tool's `ToolCounts` by name
    (the agent's own, then its toolsets'), how far its calls got;
    `expect_incomplete`: the tools `check_agent(expect_incomplete=)` let
    off. `agents`: the agents of `check_agent(agents=)` its agent tools ran;
    `child_turns` the child turns checked (one per call of an agent tool) and
    `child_crash_points` the crash points among their writes (named "child
    refunds write #1" in a failure); their tools are in `tools` as
    `refunds.refund`. `str(report)` is a line of totals, then the tools as a
    table and a warning for each safe tool that never completed
    (docs/testing.md, "The report: how far each tool got").
    """

    agent: str
    safe_tools: tuple[str, ...]
    unsafe_tools: tuple[str, ...]
    crash_points: int
    runs: int
    requests: int
    durability_errors: int
    safe_reinvocations: int
    unkeyed_unsafe_requests: tuple[str, ...] = ()
    approval_tools: tuple[str, ...] = ()
    approved: int = 0
    denied: int = 0
    edited: int = 0
    toolset_tools: tuple[str, ...] = ()
    mcp_calls: int = 0
    seconds: float = 0.0
    tools: Mapping[str, ToolCounts] = field(default_factory=dict)
    expect_incomplete: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    child_turns: int = 0
    child_crash_points: int = 0

    @property
    def never_completed(self) -> tuple[str, ...]:
        """The side effects (not `safe_to_retry`) whose handler never completed, but for
        those every call of which a person denied, and those `expect_incomplete` names:
        what `check_agent` fails on."""
        return tuple(
            name
            for name, counts in self.tools.items()
            if not counts.safe_to_retry
            and _note(counts, self.expect_incomplete) in ("never called", "never completed")
        )

    @property
    def warnings(self) -> tuple[str, ...]:
        """A line for each tool that never completed and does not fail the check: a safe
        one, one whose every call was denied, one `expect_incomplete` names."""
        lines = []
        for name, counts in self.tools.items():
            note = _note(counts, self.expect_incomplete)
            if note and name not in self.never_completed:
                kind = "safe tool" if counts.safe_to_retry else "side effect"
                lines.append(f"warning: {kind} {name!r} {note}: {counts.ended_in()}")
        return tuple(lines)

    def table(self) -> str:
        """The tools' counts as an aligned table, a row a tool."""
        header = ("tool", "kind", "calls", "completed", "ModelRetry", "failed",
                  "invalid args", "approved", "denied", "")  # fmt: skip
        rows = [header]
        for name, c in self.tools.items():
            gated = (str(c.approved), str(c.denied)) if c.requires_approval else ("-", "-")
            rows.append((
                name, "safe to retry" if c.safe_to_retry else "side effect", str(c.calls),
                str(c.completed), str(c.retried), str(c.failed), str(c.rejected), *gated,
                _note(c, self.expect_incomplete),
            ))  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = []
        for row in rows:
            cells = [
                cell.ljust(width) if i in (0, 1, len(row) - 1) else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  " + "  ".join(cells).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        text = (
            f"agent {self.agent!r}: {self.crash_points} crash points, {self.runs} runs, "
            f"{self.requests} requests; {self.durability_errors} durability errors stored, "
            f"{self.safe_reinvocations} safe re-invocations; no unsafe request sent twice, "
            "every history well formed"
        )
        if self.toolset_tools:
            text += (
                f"; {self.mcp_calls} MCP calls reached the servers of its toolsets' tools "
                f"({', '.join(self.toolset_tools)}): none of a side effect twice"
            )
        if self.approval_tools:
            text += (
                f"; {self.approved} approved ({self.edited} with edited arguments) and "
                f"{self.denied} denied calls of {', '.join(self.approval_tools)}: none ran "
                "unapproved, none twice, no denied one ran, every edited one with the edit"
            )
        if self.agents:
            text += (
                f"; {self.child_turns} child turns of {', '.join(self.agents)} "
                f"({self.child_crash_points} of the crash points in their writes): each ran "
                "once a call, its side effects at most once, and the call got its answer"
            )
        if self.unkeyed_unsafe_requests:
            text += (
                "; note: requests of unsafe tools without the call's idempotency key in a "
                f"header: {', '.join(self.unkeyed_unsafe_requests)}"
            )
        if self.seconds:
            text += f" ({self.seconds:.1f} s)"
        if self.tools:
            text += "\n" + self.table()
        for line in self.warnings:
            text += f"\n{line}"
        return text


def _note(counts: ToolCounts, expected: Collection[str]) -> str:
    """Why a tool never completed, or "" if it did."""
    if counts.completed:
        return ""
    if counts.calls == 0:
        what = "never called"
    elif counts.denied and not counts.approved:
        what = "never ran: every call denied"
    else:
        what = "never completed"
    return f"{what} (expected)" if counts.name in expected else what


@dataclass(slots=True)
class _ToolTally:
    calls: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    rejected: int = 0
    approved: int = 0
    denied: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Tally:
    """The counts of a check so far, over every scenario played and checked."""

    runs: int = 0
    requests: int = 0
    durability_errors: int = 0
    safe_reinvocations: int = 0
    crash_points: int = 0
    unkeyed: set[str] = field(default_factory=set)
    approved: int = 0
    denied: int = 0
    edited: int = 0
    mcp_calls: int = 0
    tools: dict[str, _ToolTally] = field(default_factory=dict)
    child_turns: int = 0
    child_crash_points: int = 0

    def count_tools(
        self,
        runs: Iterable[tuple[str, str | None, str]],
        decisions: Mapping[str, bool],
        history: Sequence[Message],
        rename: Callable[[str], str] = str,
    ) -> None:
        """Add how far each tool's calls got in a played scenario: its handler `runs`
        (tool name, outcome, what it ended in), and from the stored `history` its calls,
        the ones refused for their arguments and the `decisions` on them (call id ->
        approved). `rename`: a tool's name in the table (a child agent's: `refunds.refund`)."""
        for name, outcome, detail in runs:
            counts = self.tools.setdefault(rename(name), _ToolTally())
            if outcome == "completed":
                counts.completed += 1
            elif outcome in ("retried", "failed"):
                if outcome == "retried":
                    counts.retried += 1
                else:
                    counts.failed += 1
                counts.outcomes[detail] += 1
        names = {}
        for message in history:
            for call in message.tool_calls:
                names[call.id] = rename(call.name)
                self.tools.setdefault(rename(call.name), _ToolTally()).calls += 1
            error = tool_error(message.content) if message.role == "tool" else None
            if error and error.get("kind") == ToolErrorKind.INVALID_ARGUMENTS.value:
                counts = self.tools.setdefault(rename(message.tool_name or ""), _ToolTally())
                counts.rejected += 1
                counts.outcomes[f"invalid arguments: {clip(str(error['error']))}"] += 1
        for call_id, approved in decisions.items():
            counts = self.tools.setdefault(names.get(call_id, ""), _ToolTally())
            if approved:
                counts.approved += 1
            else:
                counts.denied += 1

    def tool_counts(self, tools: Sequence[Tool]) -> dict[str, ToolCounts]:
        """Each of `tools`' counts (zeros for one never called), in their order."""
        made = {}
        for t in tools:
            c = self.tools.get(t.name, _ToolTally())
            made[t.name] = ToolCounts(
                t.name, t.safe_to_retry, t.requires_approval, c.calls, c.completed, c.retried,
                c.failed, c.rejected, c.approved, c.denied, tuple(c.outcomes.most_common()),
            )  # fmt: skip
        return made

    def report(
        self,
        agent: str,
        tools: Sequence[Tool],
        toolset_tools: Sequence[str],
        seconds: float,
        expect_incomplete: Collection[str] = (),
        agents: Sequence[str] = (),
    ) -> AgentCheckReport:
        """The report of a finished check of agent `agent`, whose tools are `tools`."""
        return AgentCheckReport(
            agent=agent,
            safe_tools=tuple(sorted(t.name for t in tools if t.safe_to_retry)),
            unsafe_tools=tuple(sorted(t.name for t in tools if not t.safe_to_retry)),
            crash_points=self.crash_points,
            runs=self.runs,
            requests=self.requests,
            durability_errors=self.durability_errors,
            safe_reinvocations=self.safe_reinvocations,
            unkeyed_unsafe_requests=tuple(sorted(self.unkeyed)),
            approval_tools=tuple(sorted(t.name for t in tools if t.requires_approval)),
            approved=self.approved,
            denied=self.denied,
            edited=self.edited,
            toolset_tools=tuple(sorted(toolset_tools)),
            mcp_calls=self.mcp_calls,
            seconds=seconds,
            tools=self.tool_counts(tools),
            expect_incomplete=tuple(sorted(expect_incomplete)),
            agents=tuple(agents),
            child_turns=self.child_turns,
            child_crash_points=self.child_crash_points,
        )


def clip(text: str, limit: int = 100) -> str:
    """`text`, cut to `limit` characters (with "...") for a line of the report."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
