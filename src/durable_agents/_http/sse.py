"""Server-sent events read from an HTTP body: one parser for the LLM adapters'
streams, MCP's event streams and the testing kit's reading of the Worker's.

`sse_events(lines)` turns an async iterator of lines (`httpx.Response.aiter_lines()`,
or `sse_lines(chunks)` over raw bytes such as a Workers AI stream) into
`SSEEvent`s, following the WHATWG rules: `event:`, `data:` (several lines
joined with "\\n"), `id:`, lines starting with `:` are comments, a blank line
ends an event, an unfinished event at the end of the body is dropped.
What an event's data means is its reader's (the LLM adapters: `llm/_stream.py`).
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

__all__ = ["SSEEvent", "sse_events", "sse_lines"]


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
