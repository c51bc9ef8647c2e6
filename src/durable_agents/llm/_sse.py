"""Server-sent events, as the streaming adapters read them (one parser for all).

`sse_events(lines)` turns an async iterator of lines (`httpx.Response.aiter_lines()`,
or `sse_lines(chunks)` over raw bytes such as a Workers AI stream) into
`SSEEvent`s, following the WHATWG rules: `event:`, `data:` (several lines
joined with "\\n"), `id:`, lines starting with `:` are comments, a blank line
ends an event, an unfinished event at the end of the body is dropped.
`json_data(event, provider)` decodes an event's data with the kit's depth
check (`_json.loads`, `MAX_DEPTH`), so a payload nested too deep is refused
before it is parsed.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

from .. import _json
from .errors import LLMConnectionError, LLMResponseError, provider_message

__all__ = [
    "SSEEvent",
    "json_data",
    "sse_events",
    "sse_lines",
    "stream_cut",
    "stream_error",
]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One server-sent event: its type ("message" when unnamed), data and id."""

    event: str
    data: str
    id: str | None = None


async def sse_lines(chunks: AsyncIterable[bytes | str]) -> AsyncIterator[str]:
    """The lines of a body read in chunks, without their ends (`\\n`, `\\r\\n` or `\\r`).

    UTF-8 is decoded incrementally (a character split across chunks is kept
    whole); a `\\r` at the end of a chunk waits for the next to see whether a
    `\\n` follows. The last line is yielded even without a line end.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer = ""
    async for chunk in chunks:
        text = decoder.decode(chunk) if isinstance(chunk, bytes | bytearray) else chunk
        if not text:
            continue
        buffer += text
        start = 0
        while True:
            cr = buffer.find("\r", start)
            lf = buffer.find("\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == len(buffer):
                    break  # maybe "\r\n" split across chunks
                yield buffer[start:cr]
                start = cr + 2 if buffer[cr + 1] == "\n" else cr + 1
            else:
                yield buffer[start:lf]
                start = lf + 1
        buffer = buffer[start:]
    buffer += decoder.decode(b"", final=True)
    if buffer.endswith("\r"):
        buffer = buffer[:-1]
        yield buffer
    elif buffer:
        yield buffer


async def sse_events(lines: AsyncIterable[str]) -> AsyncIterator[SSEEvent]:
    """The events in a stream of SSE lines (see the module's docstring)."""
    event = ""
    data: list[str] = []
    last_id: str | None = None
    async for raw in lines:
        line = raw.rstrip("\r\n")  # aiter_lines may keep the line end
        if not line:
            if data:
                yield SSEEvent(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue  # a comment (keep-alive)
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id" and "\0" not in value:
            last_id = value
        # "retry" and unknown fields are ignored


def json_data(event: SSEEvent, provider: str) -> Any:
    """An event's data decoded as JSON; `LLMResponseError` when it is not JSON or too deep."""
    try:
        # Unrepaired: a surrogate pair may be split between two events; the response
        # built from the pieces is repaired whole (LLMResponse, TextDelta).
        return _json.loads(event.data, repair=False)
    except _json.JSONTooDeepError as exc:
        raise LLMResponseError(
            f"{provider} streamed an event with {exc}; refused before parsing",
            provider=provider,
            body=event.data[:200],
        ) from None
    except ValueError:
        raise LLMResponseError(
            f"{provider} streamed an event whose data is not JSON "
            f"(event {event.event!r}); is LLM_BASE_URL the provider's API?",
            provider=provider,
            body=event.data,
        ) from None


# Words in a streamed error that say it may pass (Anthropic's overloaded_error and
# api_error, OpenAI's server_error, rate limits, timeouts): such an error is retried.
_TRANSIENT_WORDS = (
    "overloaded",
    "server_error",
    "api_error",
    "rate_limit",
    "timeout",
    "timed out",
    "unavailable",
    "capacity",
    "internal",
)


def stream_error(provider: str, data: str) -> LLMResponseError:
    """The error for an `error` event (or an error object) in a provider's stream.

    An `LLMResponseError`, retried (`retryable`) when the error says it is
    transient: overloaded, a server error, a rate limit, a timeout.
    """
    error = LLMResponseError(
        f"{provider} sent an error in its stream: {provider_message(data)[:500]}",
        provider=provider,
        body=data,
    )
    error.retryable = any(word in data.lower() for word in _TRANSIENT_WORDS)
    return error


def stream_cut(provider: str, what: str) -> LLMConnectionError:
    """The error for a stream that ended before its last event (a body cut midway)."""
    return LLMConnectionError(
        f"the {provider} stream ended before {what}: the connection was cut midway",
        provider=provider,
    )
