"""POST /sessions/{name}/chat: the AI SDK's `DefaultChatTransport` (what `useChat` sends over
HTTP) against a session, answered with the UI message stream.

The request is what the transport posts (`ChatBody`); only its newest message is new
(the stored history stays the truth). A user message runs a turn, keyed by the
message's id, so a resent one runs no second turn; an assistant message carrying the
client's tool approval responses decides each call through the kit's digest-bound
`approve` (the `approvalId` holds the call id and the digest) and streams the turn
going on. The session's object streams its turn's events as it does for
`/messages` (one definition of a turn's stream); this handler, in the Worker, turns
them into UI chunks with `ui_stream.py`, which the WebSocket transport shares. The
guide: docs/chat-clients.md; the route: docs/http-api.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr
from pydantic_core import ErrorDetails

from .._json import repair_text
from .bodies import Body
from .commands import REQUEST_KEY, Approve, Decision, SendMessage
from .live import decode_event, stream_events
from .routing import Request
from .ui_stream import Chunk, UIMessageStream, parse_approval_id, reply_message_id
from .wire import SSE_HEADERS, Reply, error_reply

__all__ = ["UI_STREAM_HEADERS", "ChatBody", "ChatMessage", "post_chat"]

UI_STREAM_HEADERS = {
    **SSE_HEADERS,
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",  # no proxy buffering: the chunks are the preview
}
_DONE = b"data: [DONE]\n\n"


class ChatMessage(BaseModel):
    """One UI message as the AI SDK sends it: its id, role and parts (other fields ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    role: Literal["user", "assistant", "system"]
    parts: list[dict[str, Any]]

    @property
    def text(self) -> str:
        """The text of its text parts, one after another."""
        texts = (p.get("text") for p in self.parts if p.get("type") == "text")
        return "\n".join(t for t in texts if isinstance(t, str))

    def decisions(self) -> list[Decision]:
        """The tool approval responses in its parts (`addToolApprovalResponse`), as decisions."""
        found = []
        for part in self.parts:
            approval = part.get("approval")
            if part.get("state") != "approval-responded" or not isinstance(approval, dict):
                continue
            named = parse_approval_id(str(approval.get("id", "")))
            if named is None or not isinstance(approval.get("approved"), bool):
                continue
            reason = approval.get("reason")
            found.append(
                Decision(
                    tool_call_id=named[0],
                    digest=named[1],
                    approved=approval["approved"],
                    reason=reason if isinstance(reason, str) else None,
                )
            )
        return found


class ChatBody(Body):
    """POST .../chat: what `DefaultChatTransport` posts, `{id, messages, trigger, messageId}`
    (and whatever `body` the app adds: ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    SHAPE: ClassVar[str] = (
        "the body is what the AI SDK's DefaultChatTransport sends: {'id', 'messages': "
        "[{'id', 'role', 'parts': [...]}, ...], 'trigger': 'submit-message'}"
    )

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    trigger: Literal["submit-message", "regenerate-message"]

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        where = ".".join(str(p) for p in errors[0]["loc"])
        return f"{where}: {errors[0]['msg']}; {cls.SHAPE}"


async def post_chat(request: Request) -> Reply:
    """POST /sessions/{name}/chat: the newest message's turn, as the UI message stream."""
    body = await request.json_body(ChatBody, required=True)
    if isinstance(body, Reply):
        return body
    if body.trigger == "regenerate-message":
        return error_reply(
            422, "regenerate-not-supported",
            "a session's history is append-only, so a reply cannot be regenerated; send a "
            "new message (trigger 'submit-message') instead",
        )  # fmt: skip
    newest = body.messages[-1]
    if newest.role == "user":
        return await _send(request, newest)
    decisions = newest.decisions()
    if newest.role != "assistant" or not decisions:
        return error_reply(
            422, "invalid-body",
            "the newest message must be a user message, or the assistant message with the "
            "client's tool approval responses",
        )  # fmt: skip
    for decision in decisions[:-1]:
        decided = await request.forward(Approve(decision=decision))
        if decided.status >= 400:
            return decided
    answer = await request.forward(Approve(decision=decisions[-1], stream=True))
    return _ui_reply(answer, UIMessageStream(newest.id))


async def _send(request: Request, message: ChatMessage) -> Reply:
    """A user message's turn, keyed by the message's id (a resend runs no second turn)."""
    text = message.text
    if not text.strip():
        return error_reply(422, "invalid-body", "the newest user message has no text part")
    if REQUEST_KEY.fullmatch(message.id) is None:
        return error_reply(
            422, "invalid-body",
            "a user message's id is its turn's Idempotency-Key: 1 to 255 printable ASCII",
        )  # fmt: skip
    answer = await request.forward(SendMessage(message=text, request_key=message.id, stream=True))
    return _ui_reply(answer, UIMessageStream(reply_message_id(message.id)))


def _ui_reply(answer: Reply, encoder: UIMessageStream) -> Reply:
    """The object's answer as the UI message stream; an error before the turn began stays an
    HTTP error (the transport raises it with its body)."""
    if answer.stream is None and answer.status >= 400:
        return answer
    chunks = _ui_chunks(answer, encoder)
    return Reply(200, None, UI_STREAM_HEADERS, stream=_sse(chunks))


async def _ui_chunks(answer: Reply, encoder: UIMessageStream) -> AsyncIterator[Chunk]:
    """The turn's events (the object's SSE) as UI chunks; always ends with `finish`."""
    if answer.stream is None:  # a result with no events to stream
        for chunk in _ending(encoder, answer.body):
            yield chunk
        return
    async for event in stream_events(answer.stream):
        if event.event in ("done", "error"):
            for chunk in _ending(encoder, json.loads(event.data)):
                yield chunk
            return
        decoded = decode_event(event)
        for chunk in [] if decoded is None else encoder.event(decoded):
            yield chunk
    for chunk in encoder.error("the turn's stream ended before its result; GET the session"):
        yield chunk


def _ending(encoder: UIMessageStream, body: Any) -> list[Chunk]:
    """The last chunks, from the turn's `done` (a result) or `error` body."""
    body = body if isinstance(body, dict) else {}
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    status = body.get("status")
    if not isinstance(status, str):
        return encoder.error(str(message or "the turn failed"))
    pending = body.get("pending")
    return encoder.end(status, pending if isinstance(pending, list) else [], error=message)


async def _sse(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    """`data: {chunk}` per chunk, then `data: [DONE]`: the stream `DefaultChatTransport` reads."""
    async for chunk in chunks:
        text = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        yield f"data: {repair_text(text)}\n\n".encode()
    yield _DONE
