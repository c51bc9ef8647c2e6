"""Every error the kit raises, under one root.

    class                                code
    DurableAgentsError                   "durable-agents"
    ├── ConfigurationError (ValueError)  "configuration"
    │   │   a setup mistake, caught before any LLM call: an agent, a tool,
    │   │   the call to `run()`, a `RetryPolicy`, an LLM adapter's arguments
    │   ├── MemoryStoreNotDurableError   "memory-store-not-durable"
    │   ├── SessionNotFoundError         "session-not-found"
    │   │       `message=None` on a session with no history
    │   ├── RequestKeyReusedError        "request-key-reused"
    │   │       a request key sent again with another message
    │   ├── InvalidCursorError           "invalid-cursor"
    │   │       a `list_sessions` cursor the store did not hand out
    │   └── ScheduleError                "invalid-schedule"
    │           a schedule with no time, a bad one, or one too many
    ├── ToolArgumentsError (ValueError)  "invalid-arguments"
    │       a call's arguments break its tool's input schema
    │       (`Tool.parse_arguments`; `run()` stores it as a result)
    ├── MessageTooLargeError (ValueError) "message-too-large"
    │       a message over a size limit; nothing was written
    ├── SessionConflictError             "session-conflict"
    │       another writer got there first; nothing was written
    ├── SessionBusyError                 "session-busy"
    │       another live run holds the session's lease; nothing was written
    ├── StoreError                       "store"
    │       the store failed or is unreachable
    ├── ApprovalError                    "approval"
    │   │   a decision on a call that needs approval was refused;
    │   │   nothing was written (see `durable_agents.approvals`)
    │   ├── ApprovalNotFoundError        "approval-not-found"
    │   │       no such call waits for a decision
    │   ├── ApprovalDigestMismatchError  "approval-digest-mismatch"
    │   │       the digest is not the stored call's
    │   ├── ApprovalAlreadyDecidedError  "approval-already-decided"
    │   │       a decision exists (of racing approvers, one wins)
    │   └── ApprovalPendingError         "approval-pending"
    │           a new message while calls wait for a decision
    ├── ToolDurabilityError              "tool-durability-error"
    │       a tool call whose result was lost in a crash and which was
    │       not re-invoked (not `safe_to_retry`)
    ├── ToolsetError                     "toolset-error"
    │       a toolset (an MCP server) could not list its tools; the turn
    │       ends with status "error", resumable
    ├── ToolFailure                      "tool-failure"
    │       a handler's (or a toolset's, e.g. MCP) way to answer its call with
    │       a result of a given `ToolErrorKind`
    └── LLMError (durable_agents.llm)    "llm"
            the LLM provider failed after its retries

`ModelRetry` is not in the tree: a handler raises it to tell the model to call
again with other arguments (a result of kind `tool-retry`).

`ToolDurabilityError` is never raised by `run()`: it is the value stored as
the tool result, for the LLM (and for code inspecting history) to see. It is
an exception class so callers can hold, raise or pattern-match it like the
others.

Each error keeps its structured fields as attributes and has a stable `code`.
Those marked (ValueError) are also `ValueError`s, as bad values are, so an
`except ValueError` written before they joined the tree still catches them.
"""

from __future__ import annotations

from typing import ClassVar

from .messages import Message, ToolErrorKind, tool_error, tool_error_content


def describe_exception(exc: BaseException) -> str:
    """An error in one line, as the kit quotes it in results and reports:
    `"TypeName: message"`, or the type's name alone when it has no message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


MIN_SECRET_CHARS = 8
"""A setting's value shorter than this is no secret to scrub: placeholders such as
`none`, `x` or `1` would otherwise be cut out of every message that holds those letters."""


def redact(text: str, secret: str | None) -> str:
    """`text` with `secret` replaced by `[redacted]`: for what the kit itself writes
    (error messages, logs), never for data it passes on (a model's reply, a tool's
    result). A secret shorter than MIN_SECRET_CHARS is left alone."""
    if not secret or len(secret) < MIN_SECRET_CHARS:
        return text
    return text.replace(secret, "[redacted]")


class DurableAgentsError(Exception):
    """Root of every error raised by durable-agents."""

    code: ClassVar[str] = "durable-agents"


class ConfigurationError(DurableAgentsError, ValueError):
    """The agent, its tools or the call to `run()` are set up wrongly."""

    code = "configuration"


class MemoryStoreNotDurableError(ConfigurationError):
    """A `session_id` was given with a store that cannot keep it across a crash.

    Use `sqlite_store(path)` (CPython) or `d1_store(env.DB)` (Workers) for a
    durable session, or drop `session_id` to run without durability.
    """

    code = "memory-store-not-durable"

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} was given with the in-memory store, which loses everything "
            "when the process dies; pass a durable store (sqlite_store or d1_store) or omit "
            "session_id to run without durability"
        )


class SessionConflictError(DurableAgentsError):
    """Another writer appended to the session since this run loaded it.

    Nothing of this write landed. Typical cause: two `run()`s on one session at
    once. Load the session again (or call `run()` again with `message=None`) to
    continue from what the winner wrote.
    """

    code = "session-conflict"

    def __init__(self, session_id: str, expected_seq: int, detail: str = "") -> None:
        self.session_id = session_id
        self.expected_seq = expected_seq
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"session {session_id!r} changed while this run held it: expected to append at "
            f"position {expected_seq}, but another writer got there first; nothing was written. "
            f"Run again with message=None to continue from the stored history{suffix}"
        )


class SessionBusyError(DurableAgentsError):
    """Another run holds the session's lease and did not let go in time.

    Nothing was written and no LLM was called. The other run is alive (its
    lease is fresh, or its process is running on this host); wait for it to
    finish, or raise `wait_seconds`. A lease left by a dead run expires after
    `lease_seconds` (at once when that process ran on this host).
    """

    code = "session-busy"

    def __init__(self, session_id: str, owner: str, expires_at_ms: int, waited: float) -> None:
        self.session_id = session_id
        self.owner = owner
        self.expires_at_ms = expires_at_ms
        self.waited = waited
        super().__init__(
            f"session {session_id!r} is busy: another run ({owner}) holds its lease; waited "
            f"{waited:.1f} s. Nothing was written; try again when that run has finished"
        )


class ApprovalError(DurableAgentsError):
    """A decision on a call that needs approval was refused; nothing was written."""

    code = "approval"

    def __init__(self, session_id: str, tool_call_id: str, message: str) -> None:
        self.session_id = session_id
        self.tool_call_id = tool_call_id
        super().__init__(message)


class ApprovalNotFoundError(ApprovalError):
    """No call with this id waits for a decision in the session (never asked, or
    already answered). List what waits with `pending_approvals()`."""

    code = "approval-not-found"

    def __init__(self, session_id: str, tool_call_id: str) -> None:
        super().__init__(
            session_id,
            tool_call_id,
            f"no call {tool_call_id!r} waits for approval in session {session_id!r}",
        )


class ApprovalDigestMismatchError(ApprovalError):
    """The digest sent with the decision is not the stored call's: the approver
    saw other arguments (or another call) than the ones that would run."""

    code = "approval-digest-mismatch"

    def __init__(self, session_id: str, tool_call_id: str) -> None:
        super().__init__(
            session_id,
            tool_call_id,
            f"the digest does not match call {tool_call_id!r} of session {session_id!r}: "
            "the decision is for other arguments than the stored call's; nothing was decided. "
            "Show the approver the call from pending_approvals() and send its digest",
        )


class ApprovalAlreadyDecidedError(ApprovalError):
    """The call was decided already; of racing approvers exactly one wins."""

    code = "approval-already-decided"

    def __init__(self, session_id: str, tool_call_id: str, decision: str) -> None:
        self.decision = decision
        super().__init__(
            session_id,
            tool_call_id,
            f"call {tool_call_id!r} of session {session_id!r} was already {decision}; "
            "a decision is final",
        )


class ApprovalPendingError(ApprovalError):
    """A new message was sent while calls of the session wait for a decision (its own,
    or those of an agent tool's child session: `tool_call_ids` are theirs).

    Decide them (`approve`), then continue the turn with `run(..., message=None)`."""

    code = "approval-pending"

    def __init__(self, session_id: str, tool_call_ids: list[str]) -> None:
        self.tool_call_ids = tool_call_ids
        super().__init__(
            session_id,
            tool_call_ids[0],
            f"session {session_id!r} has calls waiting for approval ({', '.join(tool_call_ids)}); "
            "decide them before sending a new message; nothing was written",
        )


class StoreError(DurableAgentsError):
    """The store failed: unreachable, locked for too long, or an unexpected SQL error."""

    code = "store"

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        self.session_id = session_id
        super().__init__(message)


class SessionNotFoundError(ConfigurationError):
    """`run(..., message=None)` on a session with no stored history: nothing to
    resume. Send a message to start the session instead."""

    code = "session-not-found"

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} has no history to resume; send a message to start it"
        )


class RequestKeyReusedError(ConfigurationError):
    """A `request_key` that already started a turn came back with another message.

    A key names one request; a retry must repeat it exactly. Use a new key
    for a new message."""

    code = "request-key-reused"

    def __init__(self, session_id: str, request_key: str) -> None:
        self.session_id = session_id
        self.request_key = request_key
        super().__init__(
            f"request_key {request_key!r} already started a turn with another message in "
            f"session {session_id!r}; use a new key for a new message"
        )


class ScheduleError(ConfigurationError):
    """A schedule that cannot be made (see `durable_agents.schedules`): no time or
    both times, a time too far ahead or not ISO 8601 with a zone, an empty or
    oversized message, too many schedules. Nothing was stored."""

    code = "invalid-schedule"


class InvalidCursorError(ConfigurationError):
    """A `list_sessions(cursor=...)` that is not a cursor a store handed out
    (`SessionPage.next_cursor`): malformed, cut short or edited. Start again
    from the first page (`cursor=None`)."""

    code = "invalid-cursor"

    def __init__(self, cursor: object) -> None:
        self.cursor = cursor
        shown = repr(cursor) if len(repr(cursor)) <= 80 else repr(cursor)[:77] + "..."
        super().__init__(
            f"{shown} is not a session listing cursor; pass a next_cursor a listing returned, "
            "or none for the first page"
        )


class ToolArgumentsError(DurableAgentsError, ValueError):
    """The LLM's arguments for a call do not fit the tool's input schema.

    Raised by `Tool.parse_arguments`, before the handler is called. `run()`
    never raises it: it stores an `invalid-arguments` result for the call,
    and the model may call again. `tool_name` names the tool when known.
    """

    code = ToolErrorKind.INVALID_ARGUMENTS.value

    def __init__(self, problems: str, *, tool_name: str | None = None) -> None:
        self.problems = problems
        self.tool_name = tool_name
        super().__init__(problems)


class MessageTooLargeError(DurableAgentsError, ValueError):
    """A message is over a size limit: the store's row limit, or the agent's
    `max_message_bytes` for a user message. Nothing was written."""

    code = "message-too-large"

    def __init__(
        self, session_id: str, size: int, limit: int, role: str, *, limit_name: str = "row limit"
    ) -> None:
        self.session_id = session_id
        self.size = size
        self.limit = limit
        self.role = role
        super().__init__(
            f"a {role} message of {size:,} bytes is over the {limit_name} of {limit:,} bytes; "
            "nothing was written"
        )


class ToolDurabilityError(DurableAgentsError):
    """A tool call was requested, but its result was never stored, and it was not re-invoked.

    The run loop stores this as the call's result when it resumes a session whose
    last step crashed between write #1 (the call) and write #2 (its result), for
    any tool not declared `safe_to_retry`. The side effect may or may not have
    happened; the LLM sees this error and decides (check, ask, or give up).

    Its wire form (the tool message content) is JSON with exactly the keys
    `error`, `kind`, `toolName`, `toolCallId`.
    """

    code = ToolErrorKind.TOOL_DURABILITY_ERROR.value
    kind: ClassVar[ToolErrorKind] = ToolErrorKind.TOOL_DURABILITY_ERROR

    def __init__(self, tool_name: str, tool_call_id: str, message: str | None = None) -> None:
        self.tool_name = tool_name
        self.tool_call_id = tool_call_id
        self.message = message or (
            f"Tool '{tool_name}' (call {tool_call_id}) was requested but its execution did not "
            "complete durably: the process stopped before its result was stored, so it may or may "
            "not have taken effect. It was not re-invoked because it is not declared "
            "safe_to_retry. Check whether the effect happened before trying again, or ask the user."
        )
        super().__init__(self.message)

    def to_content(self) -> str:
        """The tool message content stored for this call."""
        return tool_error_content(
            self.kind, self.message, toolName=self.tool_name, toolCallId=self.tool_call_id
        )

    @classmethod
    def from_message(cls, message: Message) -> ToolDurabilityError | None:
        """The error a stored tool message carries, or None if it is not one."""
        data = tool_error(message.content) if message.role == "tool" else None
        if data is None or data.get("kind") != cls.kind:
            return None
        return cls(str(data.get("toolName")), str(data.get("toolCallId")), str(data.get("error")))


class ToolsetError(DurableAgentsError):
    """A toolset could not list its tools (its server is down, refused us, or answered
    something that is not its protocol). `run()` ends the turn with status "error"
    and `error_code` "toolset-error"; nothing of the turn but its message is
    stored, and `message=None` tries again."""

    code = "toolset-error"

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


class ToolFailure(DurableAgentsError):
    """Raised by a handler to answer its call with a failure of a given kind.

    The run loop stores `{"error": message, "kind": kind}` as the call's result.
    `outcome_unknown=True` says the effect may have happened (a request sent,
    no answer read): for a tool not `safe_to_retry` the result is then a
    `tool-durability-error` instead, as for a call lost in a crash. The MCP
    toolset (`durable_agents.mcp`) answers a server's `isError` and its
    protocol errors this way. Its `code` is "tool-failure"; its `kind`, the result's.
    """

    code = "tool-failure"

    def __init__(
        self, message: str, *, kind: ToolErrorKind = ToolErrorKind.TOOL_FAILED,
        outcome_unknown: bool = False,
    ) -> None:  # fmt: skip
        self.message = message
        self.kind = ToolErrorKind(kind)
        self.outcome_unknown = outcome_unknown
        super().__init__(message)


class ModelRetry(Exception):
    """Raised by a handler to send the model back with what to change: "that date is in
    the past, pick a future one".

    The call's result is `{"error": message, "kind": "tool-retry"}` and the model
    may call again. At most `Agent.max_tool_retries` of a tool's calls in one turn
    are answered this way; past that, the next is a `tool-failed` result. The
    handler ran: whatever it did before raising is its own business (the kit
    stores the result as for any other call, so it is never run again).
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)
