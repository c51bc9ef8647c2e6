"""The shape every stored session must have (turns of user message, steps, final reply),
and a history as a failure prints it."""

from __future__ import annotations

from collections.abc import Sequence

from ...messages import Message, ToolCall, tool_error


def stored_calls(history: Sequence[Message]) -> dict[str, ToolCall]:
    """Every stored call, by id."""
    return {c.id: c for m in history for c in m.tool_calls}


def stored_results(history: Sequence[Message]) -> dict[str | None, Message]:
    """Every stored result, by the id of the call it answers."""
    return {m.tool_call_id: m for m in history if m.role == "tool"}


def assert_well_formed(history: Sequence[Message], user_messages: Sequence[str]) -> None:
    """The shape every stored session must have: turns of user, steps, final reply.

    A step is an assistant message with calls, followed directly by exactly one
    result per call, in the order the kit stored them: a step's write #2 holds the
    results of the calls that need no decision, in call order; those of calls that
    waited for a person's decision (or that the kit deferred, or that a crash left
    as orphans) come in a later write, after them. So a gated call declared first
    is answered last, and any order of one result per call is well formed. A
    summary (`durable_agents.context`) may stand between a turn's steps or before
    its user message."""
    users = []
    seen: set[str] = set()
    i = 0
    assert history, "the history is empty"
    while i < len(history):
        while i < len(history) - 1 and history[i].is_summary:
            i += 1
        user = history[i]
        assert user.role == "user", (
            f"message {i}: expected a turn's user message, got {user.role!r}"
        )
        users.append(user.content)
        i = _end_of_turn(history, i + 1, seen, len(users))
    assert users == list(user_messages), (
        f"the stored user messages are {users!r}; sent (each once): {list(user_messages)!r}"
    )


def _end_of_turn(history: Sequence[Message], i: int, seen: set[str], turn: int) -> int:
    """Where turn `turn` (its steps from message `i` on, then its final reply) ends."""
    while i < len(history):
        message = history[i]
        if message.is_summary:  # stored at a step boundary, before the next LLM call
            i += 1
            continue
        assert message.role == "assistant", (
            f"message {i}: expected an assistant message, got {message.role!r} (a user "
            "message may only follow a final reply)"
        )
        if not message.tool_calls:
            return i + 1
        i = _end_of_step(history, i, seen)
    raise AssertionError(f"turn {turn} has no final reply")


def _end_of_step(history: Sequence[Message], step: int, seen: set[str]) -> int:
    """Where the step at message `step` ends: after one result per call, directly."""
    message = history[step]
    calls = {}
    for call in message.tool_calls:
        assert call.id, f"message {step}: a stored tool call has no id"
        assert call.id not in seen, f"message {step}: tool call id {call.id!r} is reused"
        seen.add(call.id)
        calls[call.id] = call
    i, answered = step + 1, set[str]()
    while i < len(history) and history[i].role == "tool":
        answered.add(_answered_call(history[i], i, step, calls, answered))
        i += 1
    missing = [f"{c.name}#{c.id}" for c in message.tool_calls if c.id not in answered]
    assert not missing, (
        f"message {step}: {len(calls)} calls, but only {len(answered)} results follow it "
        f"directly (none for {', '.join(missing)})"
        + (f"; message {i} ({history[i].role}) comes next" if i < len(history) else "")
    )
    return i


def _answered_call(
    result: Message, i: int, step: int, calls: dict[str, ToolCall], answered: set[str]
) -> str:
    """The id of the call that result `i` answers: one of its step's, not answered yet."""
    call_id = result.tool_call_id or ""
    answers = calls.get(call_id)
    assert answers is not None, (
        f"message {i}: the result of {result.tool_name}#{call_id} follows message "
        f"{step}, which made no such call (each result must follow its own step)"
    )
    assert call_id not in answered, (
        f"message {i}: a second result for {answers.name}#{call_id} (a call gets exactly one)"
    )
    assert result.tool_name == answers.name, (
        f"message {i}: the result of call {call_id} names tool "
        f"{result.tool_name!r}, the call {answers.name!r}"
    )
    return call_id


def format_history(messages: Sequence[Message]) -> str:
    """A numbered, one-line-per-message rendering of a stored history."""
    lines = []
    for seq, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            calls = ", ".join(f"{c.name}#{c.id}" for c in m.tool_calls)
            lines.append(f"    {seq:3} assistant calls [{calls}]")
        elif m.role == "tool":
            error = tool_error(m.content)
            kind = error.get("kind", "error") if error else "result"
            lines.append(f"    {seq:3} tool {m.tool_name}#{m.tool_call_id}: {kind}")
        else:
            lines.append(f"    {seq:3} {m.role}: {m.content[:70]!r}")
    return "\n".join(lines) or "    (empty)"
