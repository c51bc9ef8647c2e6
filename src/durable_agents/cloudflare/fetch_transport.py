"""An httpx transport over the Workers runtime's `fetch`.

Python Workers have no sockets for httpx's default transport to open, but the
runtime's JS `fetch` reaches the internet (and, in the local runtime, any
127.0.0.1 server). `httpx.AsyncClient(transport=FetchTransport())` sends every
request through it; under Pyodide, importing `durable_agents.cloudflare`
makes it the default of the clients the kit builds (`llm.default_client`).
On CPython use httpx's default transport.

What `fetch` does for us and httpx must not do twice: it sets `host`,
`content-length` and `connection` itself (and refuses some of them), and it
already decodes a compressed body, so the response's `content-encoding` and
`content-length` headers are dropped to stop httpx from decoding it again.
Redirects are left to httpx (`redirect: "manual"`), as on CPython.

Response bodies stream chunk by chunk from the JS `ReadableStream`, so
server-sent events arrive as they are sent. Timeouts: httpx's `read`
timeout bounds the wait for the response head and for each body chunk; on
expiry the request is aborted and `httpx.ReadTimeout` raised.

A fetch Cloudflare refuses because the invocation has used up its
subrequests (`Too many subrequests by single Worker invocation`, 50 on
Workers Free) was never sent: `InvocationLimitError`, which is not an
`httpx.TransportError`, so the run loop answers an unsafe tool that meets it
with a plain `tool-failed`, never a `tool-durability-error` (nothing may have
happened). Any other fetch failure is `httpx.ConnectError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from .. import budget
from .._timeouts import timeout

__all__ = ["FetchTransport", "InvocationLimitError"]

# The start of Cloudflare's errors for a call past an invocation's limits (fetch; other
# Cloudflare APIs), as `scripts/dev` gives them too under WORKERS_PLAN.
_LIMIT_ERRORS = ("Too many subrequests", "Too many API requests")


class InvocationLimitError(httpx.RequestError):
    """Cloudflare refused the fetch: the invocation's subrequests are used up. The
    request was never sent (see the module); its message is Cloudflare's."""


_DROPPED_REQUEST_HEADERS = frozenset({"host", "content-length", "connection"})
_DROPPED_RESPONSE_HEADERS = frozenset({"content-encoding", "content-length"})


class FetchTransport(httpx.AsyncBaseTransport):
    """Send httpx requests with the runtime's JS `fetch` (Pyodide only).

    `fetch` is the JS function to call; by default the global `fetch`, looked
    up per request (so a test or the harness can replace it).
    """

    def __init__(self, fetch: Callable[..., Awaitable[Any]] | None = None) -> None:
        self._fetch = fetch

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import js  # type: ignore[import-not-found]
        from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

        fetch = self._fetch or js.fetch
        budget.spend(subrequests=1)  # the invocation's count (`durable_agents.budget`)
        body = await request.aread()
        headers = [
            [name, value]
            for name, value in request.headers.multi_items()
            if name.lower() not in _DROPPED_REQUEST_HEADERS
        ]
        abort = js.AbortController.new()
        init: dict[str, Any] = {
            "method": request.method,
            "headers": headers,
            "redirect": "manual",
            "signal": abort.signal,
        }
        if body:
            init["body"] = to_js(body)
        timeout = _read_timeout(request)
        try:
            js_response = await _within(
                fetch(str(request.url), to_js(init, dict_converter=js.Object.fromEntries)),
                timeout,
            )
        except TimeoutError:
            abort.abort()
            raise httpx.ReadTimeout(
                f"no response from {request.url.host} within {timeout} s", request=request
            ) from None
        except JsException as exc:
            text = str(exc)
            if any(limit in text for limit in _LIMIT_ERRORS):
                raise InvocationLimitError(text, request=request) from exc
            raise httpx.ConnectError(f"fetch failed: {exc}", request=request) from exc

        response_headers = [
            (name, value)
            for name, value in _header_items(js_response.headers)
            if name.lower() not in _DROPPED_RESPONSE_HEADERS
        ]
        return httpx.Response(
            status_code=js_response.status,
            headers=response_headers,
            stream=_FetchByteStream(js_response, abort, timeout, request),
            extensions={"reason_phrase": str(js_response.statusText).encode()},
        )


class _FetchByteStream(httpx.AsyncByteStream):
    """A JS response body, read chunk by chunk."""

    def __init__(self, js_response: Any, abort: Any, timeout: float | None, request: Any) -> None:
        self._response = js_response
        self._abort = abort
        self._timeout = timeout
        self._request = request
        self._reader: Any = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        from pyodide.ffi import JsException  # type: ignore[import-not-found, unused-ignore]

        body = self._response.body
        if body is None:
            return
        self._reader = body.getReader()
        while True:
            try:
                chunk = await _within(self._reader.read(), self._timeout)
            except TimeoutError:
                self._abort.abort()
                raise httpx.ReadTimeout(
                    f"the response body stalled for {self._timeout} s", request=self._request
                ) from None
            except JsException as exc:
                raise httpx.ReadError(f"reading the response failed: {exc}") from exc
            if chunk.done:
                return
            yield bytes(chunk.value.to_bytes())

    async def aclose(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            # Cancelling a finished or errored stream may throw; nothing is left to release.
            with contextlib.suppress(Exception):
                await reader.cancel()


def _read_timeout(request: httpx.Request) -> float | None:
    timeouts = request.extensions.get("timeout") or {}
    value = timeouts.get("read")
    return float(value) if value is not None else None


async def _within(awaitable: Awaitable[Any], seconds: float | None) -> Any:
    async with timeout(seconds):  # one per read: it must leave no JS timer behind
        return await awaitable


def _header_items(js_headers: Any) -> list[tuple[str, str]]:
    # JS Headers join repeated headers with ", ", except Set-Cookie, which
    # getSetCookie() returns one by one.
    items = [(str(k), str(v)) for k, v in js_headers.entries() if str(k).lower() != "set-cookie"]
    items += [("set-cookie", str(v)) for v in js_headers.getSetCookie()]
    return items
