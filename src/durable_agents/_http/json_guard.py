"""HTTP response bodies whose JSON nests too deep, refused before anyone parses them.

A tool handler that does `response.json()` on an upstream's answer hands
that text to `json.loads`; on Pyodide, JSON nested a few thousand levels
deep overflows the JS stack there and kills the Worker (see `_json`). The
client the kit builds (`default_client`, also what the Worker hands the
tools) carries `refuse_deep_json` as a response hook: a body whose first
non-whitespace byte is `[` or `{` is scanned as it streams in, and one
nested deeper than `_json.MAX_DEPTH` raises `httpx.DecodingError` naming the
limit, from `client.get(...)` (or from the first read of a streamed
response), so the handler fails and its call gets a `tool-failed` result.

Other bodies pass untouched and keep streaming; JSON bodies stream too,
each chunk checked on the way. A body in UTF-16 or UTF-32 (which
`json.loads` accepts from bytes) is held until its end and checked whole.
The check sees the bytes httpx reads off the transport: on Pyodide that is
the decoded body (`fetch` decompresses); on CPython a compressed body is not
checked, which is harmless there (deep JSON is a `RecursionError` that the
handler's failure already covers, not a crash).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncIterator
from typing import Literal

import httpx

from .._json import MAX_DEPTH, DepthScanner, JSONTooDeepError, check_text_depth

__all__ = ["DepthCheckedStream", "refuse_deep_json"]

_WHITESPACE = b" \t\r\n"


async def refuse_deep_json(response: httpx.Response) -> None:
    """An httpx response event hook: check the body's JSON nesting as it is read."""
    try:
        content = response.content  # already read (a response built from bytes)
    except httpx.ResponseNotRead:
        stream = response.stream
        if isinstance(stream, httpx.AsyncByteStream) and not isinstance(stream, DepthCheckedStream):
            response.stream = DepthCheckedStream(stream, response.request)
        return
    if content:
        check = _BodyCheck(response.request, MAX_DEPTH)
        check.start(content)
        check.take(content)
        check.finish()


class DepthCheckedStream(httpx.AsyncByteStream):
    """Wraps a response body; raises `httpx.DecodingError` once its JSON goes too deep."""

    def __init__(
        self, inner: httpx.AsyncByteStream, request: httpx.Request, max_depth: int = MAX_DEPTH
    ) -> None:
        self._inner = inner
        self._check = _BodyCheck(request, max_depth)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        check, head = self._check, b""
        async for chunk in self._inner:
            if not check.started:  # json.detect_encoding looks at the first 4 bytes
                head += chunk
                if len(head) < 4:
                    continue
                chunk, head = head, b""
                check.start(chunk)
            if check.take(chunk):
                yield chunk
        if head:  # a body of fewer than 4 bytes
            check.start(head)
            if check.take(head):
                yield head
        held = check.finish()
        if held:
            yield held

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BodyCheck:
    """The nesting check of one body, fed chunk by chunk."""

    def __init__(self, request: httpx.Request, max_depth: int) -> None:
        self.request = request
        self.max_depth = max_depth
        self.started = False
        self.at_start = True
        self.mode: Literal["lead", "scan", "pass", "wide"] = "lead"
        self.encoding = "utf-8"
        self.scanner = DepthScanner(max_depth)
        self.held: list[bytes] = []

    def start(self, first: bytes) -> None:
        """Pick the mode from the body's first bytes (at least 4, unless it is shorter)."""
        self.started = True
        self.encoding = json.detect_encoding(first)
        if self.encoding not in ("utf-8", "utf-8-sig"):
            self.mode = "wide"

    def take(self, chunk: bytes) -> bool:
        """Check the next chunk; False if it is held back until the end (UTF-16/32)."""
        if self.mode == "wide":
            self.held.append(chunk)
            return False
        if self.mode == "lead":  # still looking for the first byte that is not whitespace
            if self.at_start and chunk.startswith(codecs.BOM_UTF8):
                chunk = chunk[len(codecs.BOM_UTF8) :]
            self.at_start = False
            rest = chunk.lstrip(_WHITESPACE)
            if rest[:1] in (b"[", b"{"):
                self.mode = "scan"
                chunk = rest
            elif rest:
                self.mode = "pass"
        if self.mode == "scan":
            try:
                self.scanner.feed(chunk)
            except JSONTooDeepError:
                raise self.error() from None
        return True

    def finish(self) -> bytes:
        """The held body (UTF-16/32), checked whole; empty for every other body."""
        if not self.held:
            return b""
        body = b"".join(self.held)
        try:
            text = body.decode(self.encoding, "surrogatepass")
        except UnicodeDecodeError:
            return body  # not JSON in that encoding; json.loads refuses it too
        try:
            check_text_depth(text, self.max_depth)
        except JSONTooDeepError:
            raise self.error() from None
        return body

    def error(self) -> httpx.DecodingError:
        where = self.request.url.host or str(self.request.url)
        return httpx.DecodingError(
            f"the response from {where} is JSON nested deeper than {self.max_depth} levels; "
            "refused before parsing",
            request=self.request,
        )
