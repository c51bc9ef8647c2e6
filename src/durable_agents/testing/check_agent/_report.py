"""What `check_agent` saw and returns: the requests it recorded, the counts it keeps as it
checks (`Tally`), and the report made of them (`AgentCheckReport`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
class AgentCheckReport:
    """What `check_agent` ran. Every count is over all crash points and both modes.

    `mcp_calls` counts the `tools/call` requests that reached a toolset's
    server; `edited` the approved calls that ran (or were lost) with an
    approver's edited arguments."""

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
        if self.unkeyed_unsafe_requests:
            text += (
                "; note: requests of unsafe tools without the call's idempotency key in a "
                f"header: {', '.join(self.unkeyed_unsafe_requests)}"
            )
        if self.seconds:
            text += f" ({self.seconds:.1f} s)"
        return text


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

    def report(
        self, agent: str, tools: Sequence[Tool], toolset_tools: Sequence[str], seconds: float
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
        )
