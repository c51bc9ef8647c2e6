"""What the HTTP adapters (OpenAI, Anthropic) share: one POST of a request, whole or
streamed, with retries, and the mapping of HTTP failures to `LLMError`s.

The client itself and SSE reading are the kit's (`durable_agents._http`); see
docs/llm-providers.md for the errors and retries.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Self

import httpx

from .. import _json
from .._http.client import default_client
from .._http.sse import SSEEvent, sse_events
from ..errors import ConfigurationError, redact
from ..messages import LLMResponse, StreamPart, TextDelta
from ._retry import (
    RetryPolicy,
    attempt_timeout,
    call_with_retries,
    parse_retry_after,
    stream_with_retries,
)
from .errors import (
    LLMAuthenticationError,
    LLMConnectionError,
    LLMContextLengthError,
    LLMError,
    LLMHTTPError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMResponseError,
    LLMTimeoutError,
    provider_message,
)

# Phrases providers use for "the prompt is over the context window" on a 400.
_CONTEXT_LENGTH_MARKERS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "prompt is too long",
    "maximum context",
    "too many tokens",
    "input is too long",
)


def check_base_url(base_url: str, setting: str = "LLM_BASE_URL") -> str:
    """`base_url` without a trailing slash; ConfigurationError unless it is http(s)."""
    if not base_url.startswith(("http://", "https://")):
        raise ConfigurationError(f"{setting} must be an http:// or https:// URL, got {base_url!r}")
    return base_url.rstrip("/")


class HTTPPoster:
    """POSTs JSON with retries, owning the client only if it created it."""

    def __init__(
        self,
        *,
        provider: str,
        client: httpx.AsyncClient | None,
        transport: httpx.AsyncBaseTransport | None,
        timeout: float,
        retry: RetryPolicy,
        secret: str | None,
    ) -> None:
        if client is not None and transport is not None:
            raise ConfigurationError(f"{provider}: pass either client= or transport=, not both")
        self.provider = provider
        self.timeout = timeout
        self.retry = retry
        self._secret = secret
        self._client = client
        self._transport = transport
        self._owns_client = client is None

    @property
    def client(self) -> httpx.AsyncClient:
        # Made on first use, not at construction: a Worker may build its LLM at
        # import time, where no I/O object may be created.
        if self._client is None:
            if self._transport is not None:
                self._client = httpx.AsyncClient(timeout=self.timeout, transport=self._transport)
            else:
                self._client = default_client(self.timeout)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None

    def scrub(self, text: str) -> str:
        """`text` (an error message the kit writes) without the API key. Never applied
        to a reply before it is read: a reply is data, passed on as sent."""
        return redact(text, self._secret)

    async def post_json(
        self,
        url: str,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        parse: Callable[[Any], LLMResponse],
    ) -> LLMResponse:
        """POST `body` as JSON; the reply, read by `parse` from its JSON, retried per the
        policy. The reply is data: read as sent; only errors are scrubbed of the key."""
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        all_headers = {"content-type": "application/json", "accept": "application/json"}
        all_headers.update(headers)

        async def attempt(time_left: float) -> Any:
            timeout = attempt_timeout(self.timeout, time_left)
            try:
                response = await self.client.post(
                    url, content=payload, headers=all_headers, timeout=timeout
                )
            except (httpx.TransportError, httpx.DecodingError) as exc:
                raise self.transport_error(exc, url, timeout) from exc
            if response.status_code >= 400:
                raise self.http_error(response, response.text)
            return self.parsed(parse, self.decode_json(response, response.text, url))

        return await call_with_retries(self.retry, attempt)

    def stream(
        self,
        url: str,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        parse: Callable[[AsyncIterator[SSEEvent]], AsyncGenerator[StreamPart, None]],
        parse_whole: Callable[[Any], LLMResponse],
    ) -> AsyncIterator[StreamPart]:
        """POST `body` as JSON and read the answer as server-sent events, retried per the policy.

        `parse` turns the events into deltas and a final `LLMResponse`. An
        error status before the stream starts is the same error `post_json`
        raises; a body that breaks midway is an `LLMConnectionError`, retried
        (see `stream_with_retries`). A server that answers with one JSON body
        instead of a stream is read with `parse_whole` (its text as one delta);
        a body that is neither is the `LLMResponseError` `post_json` raises.
        """
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        all_headers = {"content-type": "application/json", "accept": "text/event-stream"}
        all_headers.update(headers)

        async def attempt(time_left: float) -> AsyncGenerator[StreamPart, None]:
            timeout = attempt_timeout(self.timeout, time_left)
            started = False
            try:
                request = self.client.build_request(
                    "POST", url, content=payload, headers=all_headers, timeout=timeout
                )
                response = await self.client.send(request, stream=True)
                try:
                    if response.status_code >= 400:
                        await response.aread()
                        raise self.http_error(response, response.text)
                    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                    if kind not in ("", "text/event-stream"):  # JSON, or an HTML error page
                        await response.aread()
                        reply = self.parsed(
                            parse_whole, self.decode_json(response, response.text, url)
                        )
                        if reply.text:
                            yield TextDelta(reply.text)
                        yield reply
                        return
                    started = True
                    events = sse_events(response.aiter_lines())
                    async with contextlib.aclosing(parse(events)) as parts:
                        async for part in parts:
                            yield part
                finally:
                    await response.aclose()
            except (httpx.TransportError, httpx.DecodingError) as exc:
                if started and not isinstance(exc, httpx.TimeoutException):
                    raise LLMConnectionError(
                        f"the {self.provider} stream from {url} broke off: "
                        f"{self.scrub(str(exc)) or type(exc).__name__}",
                        provider=self.provider,
                    ) from exc
                raise self.transport_error(exc, url, timeout) from exc
            except LLMResponseError as exc:
                self.scrub_error(exc)
                raise

        return stream_with_retries(self.retry, attempt, provider=self.provider)

    def parsed(self, parse: Callable[[Any], LLMResponse], data: Any) -> LLMResponse:
        """`parse(data)`; an `LLMResponseError` it raises comes out scrubbed of the key."""
        try:
            return parse(data)
        except LLMResponseError as exc:
            self.scrub_error(exc)
            raise

    def scrub_error(self, exc: LLMResponseError) -> None:
        """Scrub `exc`'s message and body of the key (an error the kit writes)."""
        exc.body = self.scrub(exc.body)
        exc.args = tuple(self.scrub(str(arg)) for arg in exc.args)

    def transport_error(
        self, exc: httpx.TransportError | httpx.DecodingError, url: str, timeout: float
    ) -> LLMError:
        """The `LLMError` for an httpx failure (no answer, a timeout, a body cut off)."""
        if isinstance(exc, httpx.TimeoutException):
            return LLMTimeoutError(
                f"{self.provider} did not answer within {timeout:.3g} s ({url}); "
                "raise timeout= for long generations",
                provider=self.provider,
            )
        if isinstance(exc, httpx.DecodingError):  # e.g. JSON nested too deep (the client's hook)
            return LLMResponseError(
                f"{self.provider} answered with a body that cannot be read from {url}: "
                f"{self.scrub(str(exc))}",
                provider=self.provider,
            )
        return LLMConnectionError(
            f"could not reach {self.provider} at {url}: "
            f"{self.scrub(str(exc)) or type(exc).__name__}; check LLM_BASE_URL and "
            "the network",
            provider=self.provider,
        )

    def decode_json(self, response: httpx.Response, text: str, url: str) -> Any:
        """A 2xx body as JSON, read as sent (never scrubbed first).

        `NaN`, `Infinity` and numbers past a double's range are read (as float),
        so that one call's arguments holding one make that call
        `invalid-arguments` (see `messages.LLMResponse`), as on the streamed path,
        instead of failing the reply. `LLMResponseError` when the body is not JSON
        or nests too deep; `LLMConnectionError` (retried, as a stream cut off is)
        when it is JSON cut off before its end.
        """
        try:
            return _json.loads(text, non_finite=True)
        except _json.JSONTooDeepError as exc:
            raise LLMResponseError(
                f"{self.provider} answered HTTP {response.status_code} with {exc} from "
                f"{url}; refused before parsing",
                provider=self.provider,
                body=self.scrub(text),
            ) from None
        except ValueError:
            if _cut_off(text):
                raise LLMConnectionError(
                    f"the {self.provider} answer from {url} broke off: its JSON ends after "
                    f"{len(text):,} characters, before it closes",
                    provider=self.provider,
                ) from None
            raise LLMResponseError(
                f"{self.provider} answered HTTP {response.status_code} with something that "
                f"is not JSON from {url}; check LLM_BASE_URL",
                provider=self.provider,
                body=self.scrub(text),
            ) from None

    def http_error(self, response: httpx.Response, text: str) -> LLMHTTPError:
        text = self.scrub(text)
        cls = error_class_for(response.status_code, provider_message(text))
        return cls(
            response.status_code,
            text,
            provider=self.provider,
            retry_after=_retry_after(response.headers),
        )


def _cut_off(text: str) -> bool:
    """True for an object or array that opens and never closes: JSON cut off on the way."""
    body = text.strip()
    if not body.startswith(("{", "[")):
        return False
    scanner = _json.DepthScanner()
    try:
        scanner.feed(body)
    except ValueError:  # too deep: not a cut
        return False
    return scanner.depth > 0 or scanner.in_string


def error_class_for(status: int, detail: str) -> type[LLMHTTPError]:
    """The error class for an HTTP status and the provider's error text."""
    if status in (401, 403):
        return LLMAuthenticationError
    if status == 404:
        return LLMModelNotFoundError
    if status == 429:
        return LLMRateLimitError
    if status in (400, 413, 422):
        lowered = detail.lower()
        if status == 413 or any(marker in lowered for marker in _CONTEXT_LENGTH_MARKERS):
            return LLMContextLengthError
    return LLMHTTPError


def _retry_after(headers: httpx.Headers) -> float | None:
    # OpenAI and Anthropic also send the millisecond form, which is more precise.
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


class HTTPAdapter:
    """What the HTTP adapters share: the poster, closing, and a repr without the key."""

    provider: str = ""
    model: str
    base_url: str
    _http: HTTPPoster

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def retry(self) -> RetryPolicy:
        return self._http.retry

    async def aclose(self) -> None:
        """Close the HTTP client if this adapter made it (an injected one is left open)."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
