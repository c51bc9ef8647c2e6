"""The `LLM` protocol: what `run(agent, llm=...)` talks to.

Beside the adapters that implement it, and importing only `messages`, so the
run loop depends on this protocol and never on an adapter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from ..messages import LLMResponse, Message, StreamPart, ToolSpec

__all__ = ["LLM", "StreamingLLM"]


class LLM(Protocol):
    """Anything that can take the conversation and answer with text and tool calls.

    Use `durable_agents.llm` (`AnthropicLLM`, `OpenAILLM` for any
    OpenAI-compatible server, `WorkersAILLM` inside a Worker, or
    `llm_from_env`); offline, `TestLLM` (any agent, no script) or
    `FunctionLLM(fn)` (your own answers); `testing.ScriptedLLM` for a fixed
    list of answers in tests. `chat()` may retry inside (an LLM call is safe
    to repeat); whatever it raises ends the run with status "error".
    """

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse: ...


@runtime_checkable
class StreamingLLM(LLM, Protocol):
    """An `LLM` that can also answer piece by piece (every adapter of the kit can).

    `stream()` yields `TextDelta`s and `ToolCallDelta`s as the provider sends
    them, then exactly one `LLMResponse`, the same `chat()` would return, and
    nothing after it. It retries as `chat()` does: a call that fails before
    its first piece is retried as usual; one that breaks midway is retried
    whole, and the pieces already yielded are not yielded again (a retry
    that words the text differently yields nothing more until its
    `LLMResponse`). `run(..., on_event=...)` uses it when the LLM has it.
    """

    def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[StreamPart]: ...
