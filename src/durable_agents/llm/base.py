"""The `LLM` protocol: what `run(agent, llm=...)` talks to.

Beside the adapters that implement it, and importing only `messages`, so the
run loop depends on this protocol and never on an adapter.
"""

from __future__ import annotations

from typing import Protocol

from ..messages import LLMResponse, Message, ToolSpec

__all__ = ["LLM"]


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
