"""What the model is sent: a window of the session, within a token budget.

Every message stays stored. What an LLM call gets is the agent's instructions,
the latest summary (a stored system message that stands for the session's
first `summary_of` messages), then the messages after what it covers:

    stored:   0 ........ e ......... s ........................ now
                                     └ summary of 0..e-1 (summary_of = e)
    sent:     [instructions] [summary] [e .. now, without s]

When that is over `Agent.max_context_tokens`, the run loop compacts before its
next LLM call (a step boundary: every call is answered): it picks a cut `p`
where a turn begins (a user message, so a call and its results are never split
and the running turn is sent whole), has the older part folded into the summary (an LLM call, or the
agent's own `summarize`), and stores the new summary in one append, like any
other write. A crash before that write loses nothing (the next turn compacts
again); after it, the next turn loads from `p` on (`Store.load_context`). No
tool runs while compacting, so nothing can run twice.

Tokens are estimated, not counted: about 4 characters a token (JSON and code
run closer to 3, hence the default budget's margin).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from .llm.base import LLM
from .messages import Message, ToolSpec, Usage

__all__ = [
    "DEFAULT_MAX_CONTEXT_TOKENS",
    "HistoryProcessor",
    "Summarizer",
    "estimate_tokens",
    "summarize_with_llm",
    "transcript",
]

DEFAULT_MAX_CONTEXT_TOKENS = 64_000
"""Fits the 128k-token models with room for the reply and for a tokenizer that counts
more tokens than the estimate (and the 200k ones with more)."""

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
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


def estimate_tokens(messages: Sequence[Message], specs: Sequence[ToolSpec] = ()) -> int:
    """About how many tokens the model reads for `messages` and the tool specs."""
    chars = sum(_message_chars(m) for m in messages)
    chars += sum(len(s.name) + len(s.description) + len(json.dumps(s.input_schema)) for s in specs)
    return chars // CHARS_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS * len(messages)


def _message_chars(message: Message) -> int:
    chars = len(message.content)
    for call in message.tool_calls:
        chars += len(call.name) + len(json.dumps(call.arguments, ensure_ascii=False)) + 16
    return chars


def summary_message(summary: Message) -> Message:
    """The system message the model reads for a stored summary."""
    return Message.system(
        "Summary of the conversation before the messages that follow (they are kept; "
        f"this stands for the first {summary.summary_of} of them):\n{summary.content}"
    )


def window(
    instructions: Message, history: Sequence[Message], unstored: Sequence[Message] = ()
) -> list[Message]:
    """What the model is sent: instructions, the summary (if the loaded history holds
    one), the other messages in order."""
    summaries = [m for m in history if m.is_summary]
    sent = [instructions]
    if summaries:
        sent.append(summary_message(summaries[-1]))
    sent += [m for m in history if not m.is_summary]
    return sent + list(unstored)


def cut_position(
    base: int, history: Sequence[Message], keep_tokens: int, reserved: int = 0
) -> int | None:
    """Where the kept tail begins (an absolute position), or None if nothing can go.

    The tail starts where a turn begins (a user message: so a call and its results
    are never split, and what the model reads after the summary starts with the
    user, as every provider accepts), after the latest stored summary, as early as
    a tail of at most `keep_tokens` allows (`reserved`: tokens of what follows the
    history, the turn's unstored message); if even the last turn is larger, at its
    start: the running turn is always sent whole."""
    last_summary = max((i for i, m in enumerate(history) if m.is_summary), default=0)
    starts = [i for i in range(last_summary + 1, len(history)) if history[i].role == "user"]
    if not starts:
        return None
    fits, tail = len(history), reserved  # fits: the first index whose tail is small enough
    for i in range(len(history) - 1, -1, -1):
        tail += estimate_tokens([history[i]])
        if tail > keep_tokens:
            break
        fits = i
    chosen = next((i for i in starts if i >= fits), starts[-1])
    return base + chosen


def transcript(messages: Sequence[Message]) -> str:
    """The messages as text for a summarizer: one paragraph each, long ones cut."""
    parts = []
    for message in messages:
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
        parts.append(f"{head}\n{text}" if text else head)
    return "\n\n".join(parts)


async def summarize_with_llm(
    llm: LLM, previous: str | None, messages: Sequence[Message]
) -> tuple[str, Usage | None]:
    """The default summarizer: one call of the turn's own model, without tools."""
    prompt = (
        f"The summary so far:\n{previous or '(none yet)'}\n\n"
        f"The messages that follow it:\n\n{transcript(messages)}\n\nWrite the new summary."
    )
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


def chunks(messages: Sequence[Message], max_tokens: int) -> list[list[Message]]:
    """`messages` in order, cut into runs of about `max_tokens` each (a long message
    counts as its transcript cut does), for summarizing one run at a time."""
    out: list[list[Message]] = [[]]
    size = 0
    limit = TRANSCRIPT_CHARS_PER_MESSAGE // CHARS_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS
    for message in messages:
        tokens = min(estimate_tokens([message]), limit + 64)
        if out[-1] and size + tokens > max_tokens:
            out.append([])
            size = 0
        out[-1].append(message)
        size += tokens
    return out if out[0] else []
