"""Rows, both ways: the parameters an INSERT binds for a message, a session, a
schedule or an approval, and the kit's objects read back from SELECT rows (a
tuple, a list, or D1's positional row). A row that does not decode is a
`StoreError` naming it. Guide: docs/contract.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import _json
from ..errors import ConfigurationError, MessageTooLargeError, StoreError
from ..limits import MAX_ROW_BYTES
from ..messages import Message, Usage, decode_tool_calls, encode_tool_calls, stored_message
from ._limits import bindable
from .base import ApprovalChange, ApprovalEvent, Schedule, SessionInfo


def session_state(last: Message) -> str:
    """What a session waits for, judged by its last message (shown by `sessions list`)."""
    if last.origin == "stopped":
        return "stopped"  # its resumes kept crashing: the kit ended it (run.stop_turn)
    if last.role == "assistant":
        return "awaiting_tool_results" if last.tool_calls else "idle"
    return "awaiting_llm"


def message_row(
    session_id: str, seq: int, message: Message, now_ms: int, max_row_bytes: int = MAX_ROW_BYTES
) -> tuple[Any, ...]:
    """The INSERT_MESSAGE parameters for one message; refuses a row over the limit (its
    content, tool calls and instructions: the texts that can be long)."""
    tool_calls = encode_tool_calls(message.tool_calls)
    size = _utf8_bytes(message.content)
    if tool_calls is not None:
        size += _utf8_bytes(tool_calls)
    if message.instructions is not None:
        size += _utf8_bytes(message.instructions)
    if size > max_row_bytes:
        raise MessageTooLargeError(session_id, size, max_row_bytes, message.role)
    usage = message.usage
    if usage is not None:
        for name, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            bindable(tokens, f"the {name} tokens of message {seq} ({message.role})", session_id)
    return (
        session_id,
        seq,
        message.role,
        message.content,
        message.tool_call_id,
        message.tool_name,
        tool_calls,
        usage.input_tokens if usage else None,
        usage.output_tokens if usage else None,
        message.request_key,
        message.summary_of,
        message.origin,
        message.instructions,
        now_ms,
    )


def _utf8_bytes(text: str) -> int:
    """The bytes of `text` in UTF-8: its length when it is ASCII (what most text is),
    without encoding it."""
    return len(text) if text.isascii() else len(text.encode())


def session_summary_params(info: SessionInfo) -> tuple[Any, ...]:
    for what, value in (
        ("its message count", info.message_count), ("its creation time", info.created_at),
        ("its update time", info.updated_at), ("its input tokens", info.input_tokens),
        ("its output tokens", info.output_tokens),
    ):  # fmt: skip
        bindable(value, what, info.id)
    return (
        info.id, info.agent_name, info.state, info.message_count, info.created_at,
        info.updated_at, info.name, info.input_tokens, info.output_tokens,
    )  # fmt: skip


def schedule_params(session_id: str, schedule: Schedule) -> tuple[Any, ...]:
    for what, value in (
        ("its due time", schedule.due_at),
        ("its creation time", schedule.created_at),
    ):
        bindable(value, f"schedule {schedule.schedule_id!r}: {what}", session_id)
    return (
        session_id,
        schedule.schedule_id,
        schedule.message,
        schedule.due_at,
        schedule.created_at,
        schedule.rule,
    )


def row_schedule(row: Sequence[Any]) -> Schedule:
    """A Schedule from a SELECT_SCHEDULES row."""
    schedule_id, message, due_at, created_at, rule = row
    return Schedule(
        str(schedule_id), str(message), int(due_at), int(created_at),
        None if rule is None else str(rule),
    )  # fmt: skip


def session_row(
    session_id: str,
    agent_name: str | None,
    messages: Sequence[Message],
    count: int,
    now_ms: int,
    session_name: str | None = None,
) -> tuple[Any, ...]:
    input_tokens, output_tokens = usage_totals(messages)
    return (
        session_id, agent_name, session_state(messages[-1]), count, now_ms, now_ms,
        session_id if session_name is None else session_name, input_tokens, output_tokens,
    )  # fmt: skip


def usage_totals(messages: Iterable[Message]) -> tuple[int, int]:
    """The input and output tokens of `messages`' stored usage, summed."""
    usages = [m.usage for m in messages if m.usage is not None]
    if not usages:
        return 0, 0
    return sum(u.input_tokens for u in usages), sum(u.output_tokens for u in usages)


def row_session_info(row: Sequence[Any]) -> SessionInfo:
    """A SessionInfo from a SESSION_COLUMNS row (tuple, list, or D1's positional row)."""
    session_id, agent_name, state, count, created_at, updated_at, name, inp, out = row
    return SessionInfo(
        id=str(session_id),
        agent_name=None if agent_name is None else str(agent_name),
        state=str(state),
        message_count=int(count),
        created_at=int(created_at),
        updated_at=int(updated_at),
        name=None if name is None else str(name),
        input_tokens=int(inp or 0),
        output_tokens=int(out or 0),
    )


def row_timeline_entry(session_id: str, seq: int, row: Sequence[Any]) -> tuple[int, Message]:
    """A (created_at, Message) from a SELECT_TIMELINE row."""
    return int(row[-1]), row_messages(session_id, [row[:-1]], start=seq)[0]


def timeline_rows(
    session_id: str, rows: Iterable[Sequence[Any]], *, start: int = 0
) -> list[tuple[int, Message]]:
    """The (created_at, Message) entries of SELECT_TIMELINE rows, the first at `start`."""
    return [row_timeline_entry(session_id, seq, row) for seq, row in enumerate(rows, start)]


def row_message(row: Sequence[Any]) -> Message:
    """A Message from a SELECT_MESSAGES row (tuple, list, or D1's positional row)."""
    (
        role,
        content,
        tool_call_id,
        tool_name,
        tool_calls,
        input_tokens,
        output_tokens,
        key,
        summary_of,
        origin,
        instructions,
    ) = row
    usage = None
    if input_tokens is not None or output_tokens is not None:
        usage = Usage(int(input_tokens or 0), int(output_tokens or 0))
    # Built by `stored_message`, by position: a load makes one a row.
    return stored_message(
        role,
        content,
        decode_tool_calls(tool_calls),
        tool_call_id,
        tool_name,
        usage,
        key,
        None if summary_of is None else int(summary_of),
        origin,
        None if instructions is None else str(instructions),
    )


def context_rows(session_id: str, rows: Sequence[Sequence[Any]]) -> tuple[int, list[Message]]:
    """(the position of the first, the messages) of SELECT_CONTEXT rows (seq first)."""
    if not rows:
        return 0, []
    start = int(rows[0][0])
    return start, row_messages(session_id, [row[1:] for row in rows], start=start)


def row_messages(
    session_id: str, rows: Iterable[Sequence[Any]], *, start: int = 0
) -> list[Message]:
    """The messages of SELECT_MESSAGES rows; a row that does not decode is a StoreError."""
    messages = []
    for seq, row in enumerate(rows, start):
        try:
            messages.append(row_message(row))
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(
                f"message {seq} of session {session_id!r} is not a valid stored message "
                f"({type(exc).__name__}: {exc}); the database was changed outside the kit",
                session_id=session_id,
            ) from exc
    return messages


def encode_arguments(arguments: Mapping[str, Any] | None) -> str | None:
    """The JSON stored in `agent_approvals.arguments` (an approval's edit), keys in the
    order given; None for none. ValueError for a value that is no strict JSON."""
    if arguments is None:
        return None
    _json.check_depth(arguments)  # encoding a too-deep value overflows Pyodide's stack
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def check_approval_change(session_id: str, change: ApprovalChange) -> None:
    """ConfigurationError, before anything is written, for a change whose edited arguments
    cannot be stored: only an approval carries them, a JSON object with its digest."""
    if change.arguments is None and change.arguments_digest is None:
        return
    problem = None
    if change.event != "approved":
        problem = f"only an approval carries edited arguments, not a {change.event} event"
    elif change.arguments is None:
        problem = "an arguments_digest without the edited arguments it is the digest of"
    elif not isinstance(change.arguments, dict):
        problem = f"edited arguments must be a JSON object, not {type(change.arguments).__name__}"
    elif not isinstance(change.arguments_digest, str) or not change.arguments_digest:
        problem = "edited arguments need their digest (approval_digest of the call with them)"
    else:
        try:
            encode_arguments(change.arguments)
        except (ValueError, TypeError) as exc:
            problem = f"edited arguments must be strict JSON ({exc})"
    if problem is not None:
        raise ConfigurationError(
            f"session {session_id!r}, call {change.tool_call_id!r}: {problem}; nothing was written"
        )


def row_approval_event(row: Sequence[Any], session_id: str = "") -> ApprovalEvent:
    """An ApprovalEvent from a SELECT_APPROVALS row; StoreError for edited arguments that
    are not the JSON object the kit stores."""
    tool_call_id, event, tool_name, digest, reason, created_at, raw, arguments_digest = row
    arguments = None
    if raw is not None:
        try:
            arguments = _json.loads(str(raw), max_depth=_json.STORED_MAX_DEPTH)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise StoreError(
                f"the approval of call {tool_call_id!r} of session {session_id!r} has edited "
                "arguments that are not a JSON object; the database was changed outside the kit",
                session_id=session_id or None,
            )
    return ApprovalEvent(
        str(tool_call_id), event, str(tool_name), str(digest),
        None if reason is None else str(reason), int(created_at), arguments,
        None if arguments_digest is None else str(arguments_digest),
    )  # fmt: skip
