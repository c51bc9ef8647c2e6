"""LLM providers: the objects `run(agent, llm=...)` talks to.

    AnthropicLLM   Claude via the Anthropic Messages API (API key)
    OpenAILLM      OpenAI, or any OpenAI-compatible server (Workers AI REST,
                   Ollama, vLLM, llama.cpp)
    WorkersAILLM   Workers AI through a Worker's `AI` binding (no key)
    llm_from_env   builds one of these (or, offline, a TestLLM) from settings
    TestLLM        offline, for any agent: calls each tool once, then replies
    FunctionLLM    offline, your own answers: fn(messages, tools) -> LLMResponse

Each is an `LLM` (`chat`) and a `StreamingLLM` (`stream`), retries transient
failures itself (`RetryPolicy`) and raises an `LLMError` when a call fails for
good. The guide: docs/llm-providers.md (settings, retries, errors, what each
adapter does with the conversation); the offline models: docs/testing.md.
"""

import typing

from ..messages import MalformedToolCall, StreamPart, TextDelta, ToolCallDelta
from .base import LLM, StreamingLLM
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
)
from .settings import DEFAULT_MODELS, PROVIDERS, llm_from_env

if typing.TYPE_CHECKING:
    from .._http.client import default_client
    from ._retry import RetryPolicy
    from .anthropic import AnthropicLLM
    from .offline import FunctionLLM, TestLLM
    from .openai import OpenAILLM
    from .workers_ai import WorkersAILLM


def __getattr__(name: str) -> typing.Any:
    # The adapters, the offline models and the HTTP client load on first use: the run
    # loop imports this package (for `base`), and a Worker needs one model, not all.
    if name == "AnthropicLLM":
        from . import anthropic

        return anthropic.AnthropicLLM
    if name == "OpenAILLM":
        from . import openai

        return openai.OpenAILLM
    if name == "WorkersAILLM":
        from . import workers_ai

        return workers_ai.WorkersAILLM
    if name in ("FunctionLLM", "TestLLM"):
        from . import offline

        return getattr(offline, name)
    if name == "RetryPolicy":
        from . import _retry

        return _retry.RetryPolicy
    if name == "default_client":
        from .._http import client

        return client.default_client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MODELS",
    "LLM",
    "PROVIDERS",
    "AnthropicLLM",
    "FunctionLLM",
    "LLMAuthenticationError",
    "LLMConnectionError",
    "LLMContextLengthError",
    "LLMError",
    "LLMHTTPError",
    "LLMModelNotFoundError",
    "LLMRateLimitError",
    "LLMResponseError",
    "LLMTimeoutError",
    "MalformedToolCall",
    "OpenAILLM",
    "RetryPolicy",
    "StreamPart",
    "StreamingLLM",
    "TestLLM",
    "TextDelta",
    "ToolCallDelta",
    "WorkersAILLM",
    "default_client",
    "llm_from_env",
]
