"""Compaction as a run does it: at a step boundary, when the request for the window is
over the agent's `max_context_tokens`, older messages are folded into a summary stored
by one append, after which the loaded history begins at the cut.

How the window, the cut and the fold are computed is `durable_agents.context`; the
guide is docs/limits.md (Long sessions: a bounded context).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import context
from ..agent import Agent
from ..llm.base import LLM
from ..messages import Message, ToolSpec, Usage
from .session_log import SessionLog

__all__ = ["Compactor"]


class Compactor:
    """Folds a run's loaded history when its window grows over the agent's limit."""

    def __init__(self, agent: Agent[Any], log: SessionLog) -> None:
        self.agent = agent
        self.log = log
        self.meter: context.WindowMeter | None = None  # what compact() measures with

    async def compact(
        self,
        llm: LLM,
        system: Message,
        unstored: list[Message],
        nudge: list[Message],
        specs: list[ToolSpec],
    ) -> Usage:
        """Fold older messages into a stored summary if the request for the window is over
        the agent's `max_context_tokens`: one append, at a step boundary. At a turn's first
        step the turn's message (`unstored`) is stored in that append, before the summary
        (so a stored summary always follows the message of the turn it was made in), and
        `unstored` is emptied. Returns the summarizer's usage."""
        if self.meter is None or self.meter.llm is not llm:
            self.meter = context.WindowMeter(llm)  # sizes each stored message once
        meter, limit = self.meter, self.agent.max_context_tokens * context.BYTES_PER_TOKEN
        log = self.log
        reserved = meter.reserved_size(system, [*unstored, *nudge] if nudge else unstored, specs)
        if reserved + meter.history_size(log.history) <= limit:
            return Usage()
        sizes = meter.sizes(log.history)
        cut = context.cut_position(
            log.base, log.history, sizes, limit // 2 - reserved, turn_unstored=bool(unstored)
        )
        if cut is None:
            return Usage()  # the running turn began before the cut: it is sent whole
        summaries = [m for m in log.history if m.is_summary]
        text, usage = await context.fold(
            lambda previous, chunk: self.summarize(llm, previous, chunk),
            summaries[-1].content if summaries else None,
            [m for m in log.history[: cut - log.base] if not m.is_summary],
            meter,
            limit,
            cut,
        )
        assert text is not None  # (there was something to fold: the cut is past a step)
        fixed = isinstance(self.agent.instructions, str)
        summary = Message(
            "system",
            text,
            usage=usage.bounded() if usage.total_tokens else None,
            summary_of=cut,
            # the turn's instructions, for a resume that no longer loads its first message
            instructions=None if fixed else system.content,
        )
        await log.append([*unstored, summary])
        unstored.clear()  # stored now: what follows sends and stores it as history
        log.start_at(cut)
        return usage

    def window(self, system: Message, unstored: Sequence[Message]) -> list[Message]:
        """What the model is sent after `compact` (`context.window`), built once a step
        from where the meter found the summaries: no look through the history."""
        log = self.log
        positions = None if self.meter is None else self.meter.summary_positions(log.history)
        return context.window(system, log.history, unstored, positions)

    async def summarize(
        self, llm: LLM, previous: str | None, messages: Sequence[Message]
    ) -> tuple[str, Usage | None]:
        if self.agent.summarize is not None:
            return await context.call_summarizer(self.agent.summarize, previous, messages)
        return await context.summarize_with_llm(llm, previous, messages)
