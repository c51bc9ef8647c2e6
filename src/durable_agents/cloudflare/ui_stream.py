"""The AI SDK's UI message stream (what `useChat`'s transports read), made from the kit's run
events as a turn goes, or from stored messages for a replay.

A chunk is a plain dict in the AI SDK 7's shape (`UIMessageChunk` in npm `ai`); both
chat transports send these, one as SSE (`chat_http.py`), one in WebSocket frames. A
turn is one UI message: its `start`, a step per LLM reply (`start-step` .. `finish-step`)
with its text and tool parts, then `finish`. A call waiting for a person is a
`tool-approval-request` whose `approvalId` names the call and the digest the client
sends back (`approval_id`, `parse_approval_id`). The guide: docs/chat-clients.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _json
from ..approvals import PendingApproval
from ..events import MessageStored, RunEvent, RunFinished
from ..messages import CALL_ID, Message, TextDelta, ToolCall, ToolErrorKind, tool_error

__all__ = [
    "FINISH_REASONS",
    "Chunk",
    "UIMessageStream",
    "approval_id",
    "parse_approval_id",
    "replay",
    "reply_message_id",
    "text_pieces",
]

Chunk = dict[str, Any]

# RunResult.status -> the AI SDK's `finishReason` (its FinishReason union); others: "other".
FINISH_REASONS: Mapping[str, str] = {
    "complete": "stop",
    "awaiting_approval": "tool-calls",
    "max_steps": "length",
    "cancelled": "interrupted",
    "error": "error",
}
_DIGEST = re.compile(r"[0-9a-f]{64}")
# A text piece: whole words, a few of them; one with no whitespace is cut at the maximum.
TEXT_PIECE_MIN = 12
TEXT_PIECE_MAX = 120


def _cut(text: str) -> int | None:
    """Where `text`'s first piece ends, or None while more text could still move it."""
    for index in range(TEXT_PIECE_MIN - 1, min(len(text), TEXT_PIECE_MAX)):
        if text[index].isspace():
            return index + 1
    return TEXT_PIECE_MAX if len(text) >= TEXT_PIECE_MAX else None


def text_pieces(text: str) -> list[str]:
    """`text` cut into the pieces its `text-delta` chunks carry: the same for a reply
    streamed (pieces cut as its text grows, the rest when it is stored) and replayed."""
    pieces = []
    while text:
        cut = _cut(text) or len(text)
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces


def approval_id(tool_call_id: str, digest: str) -> str:
    """The `approvalId` of a waiting call: its id and its digest, so the client's answer
    carries what the kit's digest-bound `approve` needs and nothing is looked up."""
    return f"{tool_call_id}:{digest}"


def parse_approval_id(value: str) -> tuple[str, str] | None:
    """(tool_call_id, digest) of an `approval_id`, or None if `value` is not one. A call id
    may hold ":" itself; the digest (64 hex) never does, so the last ":" splits them."""
    call_id, colon, digest = value.rpartition(":")
    if not colon or _DIGEST.fullmatch(digest) is None or CALL_ID.fullmatch(call_id) is None:
        return None
    return call_id, digest


def reply_message_id(request_key: str | None, position: int | None = None) -> str:
    """The UI message id of a turn's reply, the same live and replayed: from its user
    message's `request_key` (a chat client's message id is its turn's key), else from
    the user message's position in the session. The turn's first deltas come before its
    user message is stored, so a live stream knows the key, not the position."""
    return f"reply-{request_key}" if request_key else f"reply@{position}"


def _output(content: str) -> Any:
    """A tool result as the client gets it: its JSON, or the text when it is not JSON."""
    try:
        return _json.loads(content)
    except ValueError:
        return content


class UIMessageStream:
    """One UI message's chunks, fed a turn's events in order (`event`, then `end` or
    `error`). `message_id`: the id `start` gives the message: `reply_message_id` for a
    new turn, the id the client holds for a continued one; None leaves it to the client."""

    def __init__(self, message_id: str | None = None) -> None:
        self.message_id = message_id
        self._started = False
        self._step_open = False
        self._reply_stored = False  # the open step's assistant message has landed
        self._text_id: str | None = None  # the text part being streamed
        self._texts = 0
        self._shown_text = ""  # the open step's text sent so far, in whole pieces
        self._held_text = ""  # its deltas since: not a whole piece yet
        self._shown: set[str] = set()  # calls whose tool part this stream sent

    def event(self, event: RunEvent) -> list[Chunk]:
        """The chunks for one of `run()`'s events (an agent tool's child's: none)."""
        if isinstance(event, RunFinished):
            result = event.result
            error = result.error if result.status in ("error", "budget_exceeded") else None
            return self.end(result.status, result.pending, error=error)
        chunks = self._start()
        if isinstance(event, TextDelta):
            chunks += self._delta(event.text)
        elif isinstance(event, MessageStored):
            chunks += self._stored(event.message)
        return chunks

    def end(
        self,
        status: str,
        pending: Sequence[PendingApproval | Mapping[str, Any]] = (),
        *,
        error: str | None = None,
    ) -> list[Chunk]:
        """The last chunks of a turn that ended with `status` (`RunResult.status`): a
        `tool-approval-request` per call in `pending`, the turn's `error` if any, `finish`."""
        chunks = self.begin() + self._flush_text() + self._close_text()
        for call in pending:
            wire = call.to_dict() if isinstance(call, PendingApproval) else dict(call)
            call_id = str(wire["tool_call_id"])
            if call_id not in self._shown:  # a child's call, or a replay's: its part first
                call_dict = {
                    "id": call_id,
                    "name": wire["tool_name"],
                    "arguments": wire["arguments"],
                }
                chunks += self._tool_input(ToolCall.from_dict(call_dict))
            chunks.append(
                {
                    "type": "tool-approval-request",
                    "approvalId": approval_id(call_id, str(wire["digest"])),
                    "toolCallId": call_id,
                }
            )
        if error is not None:
            chunks.append({"type": "error", "errorText": error})
        return chunks + self._finish(FINISH_REASONS.get(status, "other"))

    def error(self, text: str) -> list[Chunk]:
        """The last chunks of a turn that failed without a result (a refused request, a
        store down): `error`, then `finish`. Text held for a whole piece goes out first."""
        chunks = self.begin() + self._flush_text() + self._close_text()
        chunks.append({"type": "error", "errorText": text})
        return chunks + self._finish("error")

    def begin(self) -> list[Chunk]:
        """The `start` chunk, if it was not sent yet (a stream begun before its first event)."""
        return self._start()

    def _start(self) -> list[Chunk]:
        if self._started:
            return []
        self._started = True
        if self.message_id is None:
            return [{"type": "start"}]
        return [{"type": "start", "messageId": self.message_id}]

    def _open_step(self) -> list[Chunk]:
        """A new step begins with an LLM reply: the one before it (if any) is finished."""
        if self._step_open and not self._reply_stored:
            return []
        chunks = self._close_step()
        self._step_open, self._reply_stored = True, False
        self._shown_text = self._held_text = ""
        return [*chunks, {"type": "start-step"}]

    def _close_step(self) -> list[Chunk]:
        if not self._step_open:
            return []
        self._step_open = False
        return [*self._close_text(), {"type": "finish-step"}]

    def _close_text(self) -> list[Chunk]:
        if self._text_id is None:
            return []
        text_id, self._text_id = self._text_id, None
        return [{"type": "text-end", "id": text_id}]

    def _new_text(self) -> tuple[list[Chunk], str]:
        self._text_id = f"text-{self._texts}"
        self._texts += 1
        return [{"type": "text-start", "id": self._text_id}], self._text_id

    def _delta(self, text: str) -> list[Chunk]:
        """A model's delta: the whole pieces it completes (`text_pieces`)."""
        chunks = self._open_step()
        self._held_text += text
        while (cut := _cut(self._held_text)) is not None:
            piece, self._held_text = self._held_text[:cut], self._held_text[cut:]
            chunks += self._piece(piece)
        return chunks

    def _piece(self, piece: str) -> list[Chunk]:
        chunks: list[Chunk] = []
        text_id = self._text_id
        if text_id is None:
            chunks, text_id = self._new_text()
        self._shown_text += piece
        return [*chunks, {"type": "text-delta", "id": text_id, "delta": piece}]

    def _flush_text(self) -> list[Chunk]:
        """A turn that ends mid-reply: the text held for a whole piece, as one."""
        held, self._held_text = self._held_text, ""
        return self._piece(held) if held else []

    def _stored(self, message: Message) -> list[Chunk]:
        if message.role == "assistant":
            return self._reply(message)
        if message.role == "tool" and message.tool_call_id is not None:
            return self._tool_result(message.tool_call_id, message.content)
        return []  # the user's message (the client has it), a summary

    def _reply(self, message: Message) -> list[Chunk]:
        """An LLM reply, stored: the pieces of its text not sent yet (its deltas were a
        preview of it: if the stored text does not go on from what was sent, nothing more
        of it is), then a tool part per call."""
        chunks = self._open_step()
        shown, text = self._shown_text, message.content
        rest = text[len(shown) :] if text.startswith(shown) else ""
        for piece in text_pieces(rest):
            chunks += self._piece(piece)
        chunks += self._close_text()
        self._held_text = ""
        for call in message.tool_calls:
            chunks += self._tool_input(call)
        self._reply_stored = True
        return chunks

    def _tool_input(self, call: ToolCall) -> list[Chunk]:
        self._shown.add(call.id)
        named = {"toolCallId": call.id, "toolName": call.name}
        return [
            {"type": "tool-input-start", **named},
            {"type": "tool-input-available", **named, "input": call.arguments},
        ]

    def _tool_result(self, call_id: str, content: str) -> list[Chunk]:
        failure = tool_error(content)
        if failure is None:
            return [
                {"type": "tool-output-available", "toolCallId": call_id, "output": _output(content)}
            ]
        if failure.get("kind") == ToolErrorKind.TOOL_DENIED:
            return [{"type": "tool-output-denied", "toolCallId": call_id}]
        return [
            {"type": "tool-output-error", "toolCallId": call_id, "errorText": str(failure["error"])}
        ]

    def _finish(self, reason: str) -> list[Chunk]:
        return [*self._close_step(), {"type": "finish", "finishReason": reason}]


def replay(
    messages: Sequence[Message], first_position: int = 0
) -> tuple[UIMessageStream, list[Chunk]]:
    """The current UI message from stored `messages` (the session's, `messages[0]` at
    `first_position`): everything after the last user message, as the live stream sent
    it. Returns the stream too, to go on with live events (or `end` it); it has sent no
    `finish` yet."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        stream, start = UIMessageStream(), 0
    else:
        user = messages[last_user]
        reply_id = reply_message_id(user.request_key, first_position + last_user)
        stream, start = UIMessageStream(reply_id), last_user + 1
    chunks = stream.begin()
    for offset, message in enumerate(messages[start:], start=first_position + start):
        chunks += stream.event(MessageStored(offset, message))
    return stream, chunks
