"""Errors raised by the LLM adapters, under the kit's one root.

    DurableAgentsError
    └── LLMError                        "llm"                  any failed LLM call
        ├── LLMHTTPError                "llm-http"             the provider sent an error status
        │   ├── LLMAuthenticationError  "llm-authentication"   401/403: key wrong or not allowed
        │   ├── LLMModelNotFoundError   "llm-model-not-found"  404: unknown model or wrong URL
        │   ├── LLMContextLengthError   "llm-context-length"   400: conversation too long
        │   └── LLMRateLimitError       "llm-rate-limited"     429 that outlasted the retries
        ├── LLMConnectionError          "llm-connection"       no answer: refused, reset, DNS
        │   └── LLMTimeoutError         "llm-timeout"          no answer in time
        └── LLMResponseError            "llm-response"         an answer that makes no sense

An LLM call is safe to repeat, so `chat()` retries what `retryable` marks
(429, 408/409, 5xx including Anthropic's 529, timeouts, dropped connections)
before raising; `attempts` says how many calls were made. `run()` turns any
of these into a result with status `"error"` and a consistent history, so
`run(..., message=None)` can continue the turn once the cause is fixed.

No message or repr carries the API key: bodies the provider sends back are
scrubbed of it before they are kept.
"""

from __future__ import annotations

from typing import ClassVar

from .. import _json
from ..errors import DurableAgentsError

_BODY_LIMIT = 2000


class LLMError(DurableAgentsError):
    """An LLM call failed. Catch this to handle every provider failure at once."""

    code: ClassVar[str] = "llm"

    def __init__(self, message: str, *, provider: str = "", retryable: bool = False) -> None:
        self.provider = provider
        self.retryable = retryable
        self.attempts = 1
        super().__init__(message)


class LLMHTTPError(LLMError):
    """The provider answered with an HTTP error status.

    `status_code`, `body` (the provider's error text, shortened) and
    `retry_after` (seconds the provider asked to wait, if it said) are kept.
    The subclasses name the statuses that need a different fix.
    """

    code = "llm-http"

    def __init__(
        self,
        status_code: int,
        body: str = "",
        *,
        provider: str = "",
        retry_after: float | None = None,
        detail: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.body = body[:_BODY_LIMIT]
        self.retry_after = retry_after
        retryable = status_code in (408, 409, 429) or status_code >= 500
        said = provider_message(self.body)[:500]
        super().__init__(
            f"{provider or 'the LLM provider'} answered HTTP {status_code}: "
            f"{detail or self._default_detail()}" + (f" Provider said: {said}" if said else ""),
            provider=provider,
            retryable=retryable,
        )

    def _default_detail(self) -> str:
        if self.status_code >= 500:
            return "the provider failed or is overloaded; try again later."
        return "the request was rejected; check the model name and the settings."


class LLMAuthenticationError(LLMHTTPError):
    """401/403: the API key is missing, wrong, or not allowed to use this model."""

    code = "llm-authentication"

    def _default_detail(self) -> str:
        return (
            "the API key was refused; check LLM_API_KEY (and that it belongs to this "
            "provider and may use this model)."
        )


class LLMModelNotFoundError(LLMHTTPError):
    """404: the model does not exist for this account, or the base URL is wrong."""

    code = "llm-model-not-found"

    def _default_detail(self) -> str:
        return (
            "model not found or wrong base URL; check LLM_MODEL and LLM_BASE_URL "
            "(an OpenAI-compatible base URL usually ends in /v1)."
        )


class LLMContextLengthError(LLMHTTPError):
    """400: the conversation no longer fits the model's context window."""

    code = "llm-context-length"

    def _default_detail(self) -> str:
        return (
            "the conversation is too long for the model's context window; start a new "
            "session, prune the history, or ask tools for smaller results."
        )


class LLMRateLimitError(LLMHTTPError):
    """429 that lasted through every retry: slow down or raise the account's limits."""

    code = "llm-rate-limited"

    def _default_detail(self) -> str:
        return "rate limited; wait, lower the request rate, or raise the account's limits."


class LLMConnectionError(LLMError):
    """The provider could not be reached, or dropped the connection before answering."""

    code = "llm-connection"

    def __init__(self, message: str, *, provider: str = "") -> None:
        super().__init__(message, provider=provider, retryable=True)


class LLMTimeoutError(LLMConnectionError):
    """The provider did not answer in time (raise `timeout=` for long generations)."""

    code = "llm-timeout"


class LLMResponseError(LLMError):
    """The provider answered 2xx, but with something that is not a usable reply.

    Usually a wrong base URL (an HTML page instead of JSON) or a server that is
    not OpenAI-compatible after all. Not retried.
    """

    code = "llm-response"

    def __init__(self, message: str, *, provider: str = "", body: str = "") -> None:
        self.body = body[:_BODY_LIMIT]
        super().__init__(message, provider=provider, retryable=False)


def provider_message(text: str) -> str:
    """The human part of an error body: `error.message` (and its code) for the usual JSON."""
    try:
        data = _json.loads(text)
    except ValueError:  # not JSON, or nested too deep to parse
        return text.strip()
    if isinstance(data, dict):
        error = data.get("error", data.get("detail"))
        if isinstance(error, dict):
            message = error.get("message")
            kind = error.get("code") or error.get("type")
            if isinstance(message, str):
                return f"{message} ({kind})" if isinstance(kind, str) and kind else message
        if isinstance(error, str):
            return error
        message = data.get("message")
        if isinstance(message, str):
            return message
    return text.strip()
