"""POST /sessions/{name}/chat: the AI SDK's `DefaultChatTransport` (what `useChat` sends over
HTTP) against a session, answered with the UI message stream.

The request is what the transport posts (`ChatBody`); what it asks (a user message's
turn, keyed by the message's id, or a digest-bound decision per tool approval response,
the last one streaming the turn going on) is read by `chat_request.py`, which the
WebSocket transport shares. The session's object streams its turn's events as it does
for `/messages` (one definition of a turn's stream); this handler, in the Worker, turns
them into UI chunks with `ui_stream.py` (shared too). The guide: docs/chat-clients.md;
the route: docs/http-api.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from .._json import repair_text
from .chat_request import ChatBody, read_chat
from .live import decode_event, stream_events
from .routing import Request
from .ui_stream import Chunk, UIMessageStream
from .wire import SSE_HEADERS, Reply

__all__ = ["UI_STREAM_HEADERS", "post_chat"]

UI_STREAM_HEADERS = {
    **SSE_HEADERS,
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",  # no proxy buffering: the chunks are the preview
}
_DONE = b"data: [DONE]\n\n"


async def post_chat(request: Request) -> Reply:
    """POST /sessions/{name}/chat: the newest message's turn, as the UI message stream."""
    body = await request.json_body(ChatBody, required=True)
    if isinstance(body, Reply):
        return body
    asked = read_chat(body)
    if isinstance(asked, Reply):
        return asked
    answer = await asked.send(request.forward)
    return _ui_reply(answer, UIMessageStream(asked.message_id))


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
