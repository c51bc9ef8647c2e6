"""What the model is sent: a window of the session, within a token budget.

Every message stays stored. What an LLM call gets is the agent's instructions,
the latest summary (a stored system message that stands for the session's
first `summary_of` messages), then the messages after what it covers:

    stored:   0 ........ e ......... s ........................ now
                                     └ summary of 0..e-1 (summary_of = e)
    sent:     [instructions] [summary] [e .. now, without s]

Here are the window, the sizes it is measured with (`WindowMeter`, each stored
message once), where a cut may fall (`cut_position`: where a turn begins) and
the fold of older messages into a summary (`fold`); the run loop compacts with
them at a step boundary (`_turn.compaction`). The bound this keeps, how tokens are
estimated, and why a crash while compacting loses nothing: docs/limits.md
(Long sessions: a bounded context).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from .llm.base import LLM
from .messages import Message, ToolSpec, Usage

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_MAX_CONTEXT_TOKENS",
    "HistoryProcessor",
    "Summarizer",
    "WindowMeter",
    "estimate_tokens",
    "message_size",
    "request_size",
    "summarize_with_llm",
    "transcript",
]

DEFAULT_MAX_CONTEXT_TOKENS = 64_000
"""Requests of at most 256,000 bytes: fits the 128k-token models with room for the reply
and for a tokenizer that counts more tokens than the estimate (and the 200k ones with
more)."""

BYTES_PER_TOKEN = 4
"""The estimate: a token is 4 bytes of the request body (JSON, UTF-8)."""

GENERIC_REQUEST_BYTES = 512
"""`request_size`'s room for what a request carries besides messages and tools (the
model's name, max_tokens, stream options)."""
GENERIC_MESSAGE_BYTES = 128
"""`message_size`'s room for a message's structure (role, keys, a turn's wrapper, a
tool result's block): more than any adapter of the kit writes."""
GENERIC_CALL_BYTES = 96
"""`message_size`'s room for a tool call's structure (and `request_size`'s for a tool's)."""

TRANSCRIPT_CHARS_PER_MESSAGE = 4_000
"""How much of one message a summarizer reads (the rest is cut, and says so)."""

Summarizer: TypeAlias = Callable[
    [str | None, Sequence[Message]], "str | Awaitable[str] | tuple[str, Usage | None]"
]
"""`summarize(previous_summary, messages) -> str`: the new summary of what
`previous_summary` (None for the first) and `messages` (oldest first) say. Sync or
async; may return `(text, usage)` to have its LLM usage counted."""

HistoryProcessor: TypeAlias = Callable[[list[Message]], "list[Message] | Awaitable[list[Message]]"]
"""`process(messages) -> messages`: the window about to be sent (instructions first),
changed as the agent likes (dropped, trimmed, redacted). Sent, never stored."""

SUMMARY_INSTRUCTIONS = (
    "You keep the running summary of a conversation between a user and an assistant that "
    "uses tools, so the assistant can go on without the older messages. Write the new "
    "summary from the summary so far and the messages that follow it: what the user wants, "
    "facts learned, decisions, what each tool call did and its outcome (a call that acted, "
    "such as a post, a payment or a booking, has happened: say so, so it is never repeated), "
    "and what is still open. Plain text, concise, no preamble."
)


def estimate_tokens(
    messages: Sequence[Message], specs: Sequence[ToolSpec] = (), llm: object = None
) -> int:
    """About how many tokens a request of `messages` and the tool specs is: its size as
    `llm` would send it (see `WindowMeter`; without `llm`, the generic sizes), over
    `BYTES_PER_TOKEN`, rounded up."""
    meter = WindowMeter(llm)
    size = meter.tools_size(specs) + sum(meter.measure(m) for m in messages)
    return -(-size // BYTES_PER_TOKEN)


def message_size(message: Message) -> int:
    """The bytes `message` adds to a request, for an LLM that cannot say (no
    `message_size` of its own): every string as escaped JSON, a character outside
    ASCII as a `\\u` escape (6 bytes, UTF-8 takes at most 4), a call's arguments
    escaped twice (a JSON string inside JSON, as OpenAI's are), and room for the
    structure (`GENERIC_MESSAGE_BYTES`, `GENERIC_CALL_BYTES`). At least what any
    adapter of the kit sends for it."""
    size = GENERIC_MESSAGE_BYTES + _escaped(message.content)
    if message.tool_call_id is not None:
        size += _escaped(message.tool_call_id)
    if message.tool_name is not None:
        size += _escaped(message.tool_name)
    for call in message.tool_calls:
        size += GENERIC_CALL_BYTES + _escaped(call.wire_id) + _escaped(call.name)
        size += _escaped(json.dumps(call.arguments))
    return size


def request_size(tools: Sequence[ToolSpec]) -> int:
    """The bytes of a request without messages, for an LLM that cannot say (no
    `request_size` of its own): the tool specs as escaped JSON, and room for the rest
    (`GENERIC_REQUEST_BYTES`)."""
    return GENERIC_REQUEST_BYTES + sum(
        GENERIC_CALL_BYTES + _escaped(t.name) + _escaped(t.description)
        + len(json.dumps(t.input_schema))
        for t in tools
    )  # fmt: skip


_escape_ascii = json.encoder.encode_basestring_ascii
"""What `json.dumps(text)` does for a str (quotes and escapes), called without the
encoder's dispatch: every stored message is measured with it."""


def _escaped(text: str) -> int:
    return len(_escape_ascii(text))


class WindowMeter:
    """The sizes of what one LLM is sent, in bytes, each stored message measured once.

    The LLM's own `message_size(message)` and `request_size(tools)` when it has them
    (the kit's adapters do: the JSON they send, see `durable_agents.llm.base.SizedLLM`),
    else the generic ones of this module. `history_size`, `sizes` and
    `summary_positions` follow the loaded history as the run loop changes it (appended
    at the end, cut at the front when it compacts), with a running total: a step
    measures its new messages only, and its cost does not grow with the history. The
    list followed is checked by identity: the same list grown at the end (its last
    measured message still in place) costs nothing to check; any other list, once, a
    message at a time. A summary is measured as it is sent (`summary_message`); a tool
    result with the id its provider gave its call (`ToolCall.wire_id`), as the adapters
    send it.
    """

    def __init__(self, llm: object) -> None:
        self.llm = llm
        own = getattr(llm, "message_size", None)
        self._message_size: Callable[[Message], int] = own if callable(own) else message_size
        own = getattr(llm, "request_size", None)
        self._request_size: Callable[[Sequence[ToolSpec]], int] = (
            own if callable(own) else request_size
        )
        self._followed: Sequence[Message] | None = None  # the history list last measured
        self._measured: list[Message] = []  # the history measured so far, in order
        self._sizes: list[int] = []  # their sizes
        self._total = 0  # the sum of _sizes
        self._summaries: list[int] = []  # where the summaries among them are
        self._wire_ids: dict[str, str] = {}  # kit call id -> the provider's, where they differ
        self._tools: dict[int, tuple[Sequence[ToolSpec], int]] = {}  # by id, the list kept
        self._system: tuple[Message, int] | None = None

    def measure(self, message: Message) -> int:
        """The bytes `message` adds to a request, as sent."""
        if message.is_summary:
            message = summary_message(message)
        for call in message.tool_calls:
            if call.provider_id is not None:
                self._wire_ids[call.id] = call.provider_id
        wire_id = self._wire_ids.get(message.tool_call_id or "")
        if wire_id is not None:
            message = dataclasses.replace(message, tool_call_id=wire_id)
        return int(self._message_size(message))

    def tools_size(self, tools: Sequence[ToolSpec]) -> int:
        """The bytes of a request with these tools and no message."""
        known = self._tools.get(id(tools))
        if known is None or known[0] is not tools:
            known = self._tools[id(tools)] = (tools, int(self._request_size(tools)))
        return known[1]

    def system_size(self, instructions: Message) -> int:
        if self._system is None or self._system[0] is not instructions:
            self._system = (instructions, self.measure(instructions))
        return self._system[1]

    def sizes(self, history: Sequence[Message]) -> list[int]:
        """The size of each message of `history`, as sent (its summaries as
        `summary_message`, though only the latest is sent). Not to be changed."""
        self._follow(history)
        return self._sizes

    def summary_positions(self, history: Sequence[Message]) -> list[int]:
        """Where the summaries of `history` are (for `window`). Not to be changed."""
        self._follow(history)
        return self._summaries

    def _follow(self, history: Sequence[Message]) -> None:
        """Measure what `history` holds past what was measured, after dropping what it
        no longer holds."""
        measured = self._measured
        if not self._grown(history):
            if measured and (
                len(measured) > len(history) or not all(map(operator.is_, measured, history))
            ):
                self._drop_front(history)
            self._followed = history
        for message in history[len(measured) :]:
            if message.is_summary:
                self._summaries.append(len(measured))
            measured.append(message)
            size = self.measure(message)
            self._sizes.append(size)
            self._total += size

    def _grown(self, history: Sequence[Message]) -> bool:
        """Whether `history` is the list measured last, only appended to since: the run
        loop's loaded history between two compactions (a compaction replaces the list)."""
        count = len(self._measured)
        return (
            history is self._followed
            and len(history) >= count
            and (count == 0 or history[count - 1] is self._measured[-1])
        )

    def _drop_front(self, history: Sequence[Message]) -> None:
        """`history` is what was measured without its first messages (a compaction), or
        another history: keep the sizes of what it still holds."""
        measured = self._measured
        first = history[0] if history else None
        cut = next((i for i, m in enumerate(measured) if m is first), len(measured))
        kept = measured[cut:]
        if len(kept) > len(history) or not all(map(operator.is_, kept, history)):
            cut = len(measured)
        del measured[:cut], self._sizes[:cut]
        self._total = sum(self._sizes)
        self._summaries = [i - cut for i in self._summaries if i >= cut]

    def history_size(self, history: Sequence[Message]) -> int:
        """The bytes `history` adds to a request (`window`: its latest summary only)."""
        self._follow(history)
        if len(self._summaries) < 2:  # (no summary but the latest: none left out)
            return self._total
        return self._total - sum(self._sizes[i] for i in self._summaries[:-1])

    def reserved_size(
        self, instructions: Message, unstored: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> int:
        """The bytes of a request besides the history: the tools, the instructions and
        the messages not stored yet (`window(instructions, history, unstored)`)."""
        return (
            self.tools_size(tools)
            + self.system_size(instructions)
            + sum(map(self.measure, unstored))
        )


def summary_message(summary: Message) -> Message:
    """The system message the model reads for a stored summary."""
    return Message.system(
        "Summary of the conversation before the messages that follow (they are kept; "
        f"this stands for the first {summary.summary_of} of them):\n{summary.content}"
    )


def window(
    instructions: Message,
    history: Sequence[Message],
    unstored: Sequence[Message] = (),
    summaries: Sequence[int] | None = None,
) -> list[Message]:
    """What the model is sent: instructions, the summary (if the loaded history holds
    one), the other messages in order. `summaries`: where the summaries of `history`
    are, if known (`WindowMeter.summary_positions`: the run loop's window is then copied
    in slices, not looked through a message at a time); else they are looked for."""
    if summaries is None:
        summaries = [i for i, m in enumerate(history) if m.is_summary]
    sent = [instructions]
    if summaries:
        sent.append(summary_message(history[summaries[-1]]))
    start = 0
    for position in summaries:
        sent += history[start:position]
        start = position + 1
    sent += history[start:] if start else history
    sent += unstored
    return sent


def cut_position(
    base: int,
    history: Sequence[Message],
    sizes: Sequence[int],
    keep: int,
    *,
    turn_unstored: bool = False,
) -> int | None:
    """Where the kept tail begins (an absolute position), or None if nothing can go.

    The tail starts where a turn begins (a user message: so a call and its results
    are never split, and what the model reads after the summary starts with the
    user, as every provider accepts), past a message the summary does not cover yet,
    as early as a tail of at most `keep` bytes allows (`sizes`: of each message,
    `WindowMeter.sizes`; summaries are not counted, the new one replaces them). If
    even the last turn is larger, at its start: the running turn is always sent whole.
    `turn_unstored`: the running turn's message is not stored yet (its first step);
    then the end of `history` is where it begins (it is stored there, with the
    summary after it, which stands for everything before it). None if no turn
    begins after a message to fold (the running turn began before it)."""
    first = next((i for i, m in enumerate(history) if not m.is_summary), len(history))
    starts = [i for i in range(first + 1, len(history)) if history[i].role == "user"]
    if turn_unstored and first < len(history):
        starts.append(len(history))
    if not starts:
        return None
    fits, tail = len(history), 0  # fits: the first index whose tail is small enough
    for i in range(len(history) - 1, first, -1):
        if not history[i].is_summary:
            tail += sizes[i]
        if tail > keep:
            break
        fits = i
    chosen = next(i for i in starts if i >= fits) if fits <= starts[-1] else starts[-1]
    return base + chosen


def transcript(messages: Sequence[Message]) -> str:
    """The messages as text for a summarizer: one paragraph each, long ones cut."""
    return "\n\n".join(_paragraph(m) for m in messages)


def _paragraph(message: Message) -> str:
    text = message.content
    if message.role == "tool":
        head = f"[result of {message.tool_name} ({message.tool_call_id})]"
    elif message.role == "assistant":
        calls = "; ".join(
            f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)}) [{c.id}]"
            for c in message.tool_calls
        )
        head = "[assistant]" + (f" calls: {calls}" if calls else "")
    else:
        head = f"[{message.role}]"
    if len(text) > TRANSCRIPT_CHARS_PER_MESSAGE:
        cut = len(text) - TRANSCRIPT_CHARS_PER_MESSAGE
        text = f"{text[:TRANSCRIPT_CHARS_PER_MESSAGE]} [... {cut:,} more characters]"
    return f"{head}\n{text}" if text else head


def summary_prompt(previous: str | None, transcript_text: str) -> str:
    """What the default summarizer asks the model, for a transcript of the messages."""
    return (
        f"The summary so far:\n{previous or '(none yet)'}\n\n"
        f"The messages that follow it:\n\n{transcript_text}\n\nWrite the new summary."
    )


async def summarize_with_llm(
    llm: LLM, previous: str | None, messages: Sequence[Message]
) -> tuple[str, Usage | None]:
    """The default summarizer: one call of the turn's own model, without tools."""
    prompt = summary_prompt(previous, transcript(messages))
    response = await llm.chat([Message.system(SUMMARY_INSTRUCTIONS), Message.user(prompt)], [])
    text = response.text.strip()
    if not text:
        raise ValueError("the model wrote an empty summary")
    return text, response.usage


async def call_summarizer(
    summarize: Summarizer, previous: str | None, messages: Sequence[Message]
) -> tuple[str, Usage | None]:
    """An agent's `summarize`, sync or async, returning text or (text, usage)."""
    value: Any = summarize(previous, messages)
    if inspect.isawaitable(value):
        value = await value
    if isinstance(value, tuple):
        text, usage = value
    else:
        text, usage = value, None
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"summarize() must return a non-empty str, got {type(text).__name__}")
    return text, usage


async def fold(
    summarize: Callable[[str | None, Sequence[Message]], Awaitable[tuple[str, Usage | None]]],
    previous: str | None,
    messages: Sequence[Message],
    meter: WindowMeter,
    limit: int,
    summary_of: int,
) -> tuple[str | None, Usage]:
    """The summary of `previous` and `messages` (oldest first), and its usage: the
    messages summarized a run at a time, each in what keeps the default summarizer's
    request within `limit` bytes (with the summary so far; a message whose transcript
    alone is larger goes alone), each summary (to be stored with `summary_of`) kept
    within `limit // 2` (`fit_summary`)."""
    usage, start = Usage(), 0
    while start < len(messages):
        room = limit - summary_request_size(meter, previous)
        end, size = start + 1, transcript_size(messages[start])
        while end < len(messages):
            size += transcript_size(messages[end])
            if size > room:
                break
            end += 1
        previous, used = await summarize(previous, messages[start:end])
        previous = fit_summary(previous, summary_of, limit // 2, meter)
        usage += used or Usage()
        start = end
    return previous, usage


def transcript_size(message: Message) -> int:
    """The bytes a message's paragraph adds to the default summarizer's request, at most
    (escaped as `message_size` escapes, with the blank line before it)."""
    return _escaped(_paragraph(message)) + 2


def summary_request_size(meter: WindowMeter, previous: str | None) -> int:
    """The bytes of the default summarizer's request for an empty transcript."""
    return (
        meter.tools_size(())
        + meter.measure(Message.system(SUMMARY_INSTRUCTIONS))
        + meter.measure(Message.user(summary_prompt(previous, "")))
    )


def fit_summary(text: str, summary_of: int, max_bytes: int, meter: WindowMeter) -> str:
    """`text`, or as much of it as keeps the summary as sent within `max_bytes` (saying
    how much is cut): a summary never takes more than half the budget."""
    size = meter.measure(Message.summary(text, summary_of))
    keep, fitted = len(text), text
    while size > max_bytes and keep > 0:
        keep = max(0, min(keep - 1, keep * max_bytes // size - 96))
        fitted = (
            f"{text[:keep]} [... {len(text) - keep:,} more characters of the summary cut: "
            "over half of max_context_tokens]"
        )
        size = meter.measure(Message.summary(fitted, summary_of))
    return fitted
