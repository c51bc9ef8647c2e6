"""A turn's typed answer (`Agent(output_type=...)`), as the run loop takes it in.

The schema and its checks are `durable_agents.output`; here is what one run keeps
while the model tries: the accepted answer of this step, the text answers sent
back (never stored) and their usage, and how many answers of the turn were
refused, bounded by `Agent.max_output_retries`. The guide: docs/turns.md
(A typed answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..messages import (
    OUTPUT_TOOL,
    LLMResponse,
    Message,
    ToolCall,
    ToolErrorKind,
    Usage,
    tool_error,
    tool_error_content,
)
from ..output import OutputSchema

__all__ = ["OutputRetries", "output_schema", "turn_results"]

_OUTPUT_SCHEMAS: dict[Any, OutputSchema] = {}


def output_schema(output_type: Any) -> OutputSchema:
    """The output type's schema, made once per type (pydantic builds a validator)."""
    schema = _OUTPUT_SCHEMAS.get(output_type)
    if schema is None:
        schema = _OUTPUT_SCHEMAS[output_type] = OutputSchema(output_type, OUTPUT_TOOL)
    return schema


def turn_results(history: Sequence[Message], kind: ToolErrorKind, name: str) -> int:
    """How many results of tool `name` of the turn in progress, as loaded, are of `kind`."""
    # the turn's first message, looked for from the end: the turn, not the whole history
    start = next((i for i in range(len(history) - 1, -1, -1) if history[i].role == "user"), 0)
    return sum(
        1
        for m in history[start:]
        if m.role == "tool"
        and m.tool_name == name
        and (tool_error(m.content) or {}).get("kind") == kind
    )


class _History(Protocol):
    @property
    def history(self) -> list[Message]: ...


class OutputRetries:
    """One run's answers to `output_type`: accepted, sent back, or refused too often.

    `schema` is None for an agent without `output_type`: then nothing is ever
    accepted, and the count of refusals still reads the turn's stored results."""

    def __init__(self, schema: OutputSchema | None, max_retries: int, log: _History) -> None:
        self.schema = schema
        self.max_retries = max_retries
        self.log = log
        self.answer: tuple[Any] | None = None  # a final_result call of this step accepted
        self.nudge: list[Message] = []  # a text answer sent back (never stored)
        # Answers sent back in this turn: those stored before this run (counted when
        # first needed), and this run's own, text ones included.
        self.rejected: int | None = None
        self.carried = Usage()  # the usage of LLM replies that were sent back, unstored

    def rejections(self) -> int:
        """The answers of the turn in progress sent back (`output_type`)."""
        if self.rejected is None:  # those stored before this run
            self.rejected = turn_results(
                self.log.history, ToolErrorKind.INVALID_ARGUMENTS, OUTPUT_TOOL
            )
        return self.rejected

    def count_rejection(self) -> None:
        self.rejected = self.rejections() + 1

    def may_retry(self) -> bool:
        """Whether the model may be asked again for its answer."""
        return self.rejections() < self.max_retries

    def exhausted(self) -> bool:
        """Whether the turn's answers were refused more often than `max_output_retries`."""
        return self.rejections() > self.max_retries

    def text_answer(self, text: str) -> str:
        """A text reply as the stored final answer (JSON). ValueError saying what is wrong."""
        assert self.schema is not None
        return self.schema.dump(self.schema.from_text(text))

    def send_back(self, response: LLMResponse, problems: str) -> None:
        """Ask again for an answer the model gave as text that is not a valid one; nothing
        is stored (the reply's usage is, with the next stored reply)."""
        self.count_rejection()
        self.carried += response.usage or Usage()
        self.nudge = [
            Message.assistant(response.text),
            Message.user(
                f"That answer was not accepted: {problems}. Give your final answer by calling "
                f"the tool {OUTPUT_TOOL!r} with it."
            ),
        ]

    def stored_usage(self, usage: Usage | None) -> Usage | None:
        """A reply's usage as stored: with that of the replies sent back before it."""
        if not self.carried.total_tokens:
            return usage
        total, self.carried = (usage or Usage()) + self.carried, Usage()
        return total

    def gave_up_error(self, problems: str) -> str:
        """The run's `error` when the model's answers were refused too often."""
        return (
            f"the model's answer did not match the agent's output_type after "
            f"{self.max_retries} retries (max_output_retries): {problems}"
        )

    def final_answer(self) -> list[Message]:
        """The turn's final message, if this step's final_result call was accepted."""
        if self.answer is None or self.schema is None:
            return []
        (value,), self.answer = self.answer, None
        return [Message.assistant(self.schema.dump(value))]

    def answer_output(self, call: ToolCall) -> str:
        """The result of a final_result call: accepted (the turn ends with its write), or
        sent back with what is wrong."""
        assert self.schema is not None
        last = next(m for m in reversed(self.log.history) if m.role == "assistant")
        if len(last.tool_calls) != 1:
            return tool_error_content(
                ToolErrorKind.TOOL_FAILED,
                f"{OUTPUT_TOOL} was not accepted: call it on its own, once the results of your "
                "other tool calls are in.",
            )
        try:
            value = self.schema.validate(dict(call.arguments))
        except ValueError as exc:
            self.count_rejection()
            return tool_error_content(
                ToolErrorKind.INVALID_ARGUMENTS,
                f"Your final answer was not accepted: {exc}. Call {OUTPUT_TOOL} again with a "
                "corrected answer.",
            )
        self.answer = (value,)
        return "Final answer accepted."

    def output_of(self, response: str) -> Any:
        """The typed output of a complete turn whose final message is `response` (None if
        the agent has no output_type, or the turn ended before it was set)."""
        if self.schema is None:
            return None
        try:
            return self.schema.load(response)
        except ValueError:
            return None
