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

from .._http.client import default_client
from ..messages import MalformedToolCall, StreamPart, TextDelta, ToolCallDelta
from ._retry import RetryPolicy
from .anthropic import AnthropicLLM
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
from .offline import FunctionLLM, TestLLM
from .openai import OpenAILLM
from .settings import DEFAULT_MODELS, PROVIDERS, llm_from_env
from .workers_ai import WorkersAILLM

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
