"""One LLM call of a step: the window through the agent's `history_processor`, the
call streamed (its text reported as `TextDelta`s) when someone watches, and
abandoned when the run is cancelled. Nothing of it is stored here: the run loop
stores the reply (docs/contract.md); events are described in `durable_agents.events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Any

from ..agent import Agent
from ..errors import ConfigurationError
from ..events import CancelToken, EventReporter
from ..llm.base import LLM
from ..messages import LLMResponse, Message, TextDelta, ToolSpec

__all__ = ["ask_unless_cancelled", "processed"]


async def processed(agent: Agent[Any], messages: list[Message]) -> list[Message]:
    """`messages` through the agent's `history_processor`, if it has one."""
    process = agent.history_processor
    if process is None:
        return messages
    value: Any = process(list(messages))
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, list) or not all(isinstance(m, Message) for m in value):
        raise ConfigurationError(
            f"history_processor of agent {agent.name!r} must return a list of Message, "
            f"got {type(value).__name__}"
        )
    return value


async def ask_unless_cancelled(
    llm: LLM,
    messages: list[Message],
    specs: list[ToolSpec],
    events: EventReporter,
    cancel: CancelToken | None,
) -> LLMResponse | None:
    """One LLM call, streamed when someone watches; None if the run was cancelled first
    (the call is abandoned: nothing of it is stored)."""
    if cancel is None:
        return await _ask(llm, messages, specs, events)
    call = asyncio.ensure_future(_ask(llm, messages, specs, events))
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not call.done():  # cancelled, or this run itself was: nothing of it is stored
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
    if call.cancelled():
        return None
    return call.result()


async def _ask(
    llm: LLM, messages: list[Message], specs: list[ToolSpec], events: EventReporter
) -> LLMResponse:
    """The LLM's answer: from `stream()` (reporting its text) when someone watches and
    the LLM can stream, else from `chat()`."""
    stream = getattr(llm, "stream", None) if events.watched else None
    if stream is None:
        response = await llm.chat(messages, specs)
    else:
        response = None
        parts = stream(messages, specs)
        try:
            async for part in parts:
                if isinstance(part, LLMResponse):
                    response = part
                elif isinstance(part, TextDelta) and part.text:
                    await events.emit(part)
        finally:
            closing = getattr(parts, "aclose", None)
            if closing is not None:
                await closing()
        if response is None:
            raise TypeError("stream() ended without an LLMResponse")
    if not isinstance(response, LLMResponse):
        raise TypeError(f"chat() returned {type(response).__name__}, not LLMResponse")
    return response
