"""What the streaming LLM adapters read from their server-sent events: an event's
data as JSON (with the kit's depth check), and the errors a stream can end in.

The SSE parsing itself is the kit's (`durable_agents._http.sse`); how a broken
stream is retried is in docs/llm-providers.md.
"""

from __future__ import annotations

from typing import Any

from .. import _json
from .._http.sse import SSEEvent
from .errors import LLMConnectionError, LLMResponseError, provider_message

__all__ = ["json_data", "stream_cut", "stream_error"]


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
