"""The `LLM` protocol: what `run(agent, llm=...)` talks to.

Beside the adapters that implement it, and importing only `messages`, so the
run loop depends on this protocol and never on an adapter.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from ..messages import LLMResponse, Message, StreamPart, ToolSpec

__all__ = ["LLM", "SizedLLM", "StreamingLLM", "wire_size"]


class LLM(Protocol):
    """Anything that can take the conversation and answer with text and tool calls.

    Use `durable_agents.llm` (`AnthropicLLM`, `OpenAILLM` for any
    OpenAI-compatible server, `WorkersAILLM` inside a Worker, or
    `llm_from_env`); offline, `TestLLM` (any agent, no script) or
    `FunctionLLM(fn)` (your own answers); `testing.ScriptedLLM` for a fixed
    list of answers in tests. `chat()` may retry inside (an LLM call is safe
    to repeat); whatever it raises ends the run with status "error".

    It may also say how large its requests are (`SizedLLM`), so that
    `Agent(max_context_tokens=...)` bounds what it is really sent.
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


@runtime_checkable
class SizedLLM(LLM, Protocol):
    """An `LLM` that knows the size of the requests it sends (every adapter of the kit).

    `Agent(max_context_tokens=N)` keeps a request's body within `4 * N` bytes
    (`durable_agents.context`); it adds up these sizes, so they must not be less
    than what is sent. `request_size(tools)`: the bytes of a request with these
    tool specs and no message, everything else included (model, options; the
    streaming request's if it is larger). `message_size(message)`: the bytes one
    message adds to it, sent alone (a tool result with the `tool_call_id` it
    carries; the run loop hands it the provider's id when the call has one), with
    what separates it from the next. An LLM without them is sized by the generic
    `durable_agents.context.message_size` and `request_size`, which count more.
    """

    def request_size(self, tools: Sequence[ToolSpec]) -> int: ...

    def message_size(self, message: Message) -> int: ...


def wire_size(value: Any) -> int:
    """The bytes of `value` as the HTTP adapters send it: compact JSON, UTF-8."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
