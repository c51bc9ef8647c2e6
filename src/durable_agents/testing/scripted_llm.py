"""`ScriptedLLM`: an LLM that plays a script and records what it was sent.

The guide, with a crash test that uses it: docs/testing.md ("Offline models and
crash points").
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..llm.offline import stream_response
from ..messages import LLMResponse, Message, StreamPart, ToolSpec

Step = (
    LLMResponse
    | BaseException
    | Callable[[list[Message], list[ToolSpec]], LLMResponse | Awaitable[LLMResponse]]
)


class ScriptExhaustedError(BaseException):
    """A ScriptedLLM was called more times than its script has steps.

    A BaseException on purpose: a test double running out of script is a bug
    in the test, never an LLM outage for `run()` to report as status "error".
    """


@dataclass(frozen=True, slots=True)
class LLMCall:
    """What one `chat()` call was sent."""

    messages: list[Message]
    tools: list[ToolSpec]


class ScriptedLLM:
    """An LLM that plays a script: each step is an `LLMResponse` to return, an
    exception to raise, or a callable `(messages, tools) -> LLMResponse` (sync or
    async) for answers that depend on the conversation. Every call is recorded
    on `.calls`. `stream()` plays the same step in pieces (its text word by
    word, `delta_delay` seconds apart, then the `LLMResponse`).

    Use it for a test that pins each answer; `FunctionLLM` for a model that reads
    the conversation, `TestLLM` for any agent without a script."""

    def __init__(self, steps: Sequence[Step], *, delta_delay: float = 0.0) -> None:
        self.steps = list(steps)
        self.delta_delay = delta_delay
        self.calls: list[LLMCall] = []

    @property
    def remaining(self) -> int:
        return len(self.steps) - len(self.calls)

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        index = len(self.calls)
        self.calls.append(LLMCall(list(messages), list(tools)))
        if index >= len(self.steps):
            last = messages[-1] if messages else None
            raise ScriptExhaustedError(
                f"ScriptedLLM was called {index + 1} times but its script has "
                f"{len(self.steps)} steps; the last message it was sent: {last!r}"
            )
        step = self.steps[index]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, LLMResponse):
            return step
        answer = step(list(messages), list(tools))
        return await answer if inspect.isawaitable(answer) else answer

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[StreamPart]:
        """The next step, as `chat()` plays it, in pieces: deltas, then the `LLMResponse`."""
        async for part in stream_response(await self.chat(messages, tools), self.delta_delay):
            yield part
