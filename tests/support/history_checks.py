"""Invariant checks on a stored session history and on a log of tool side effects.

Shared by the process-level tests and the crash sweep. Every `assert_*`
function raises `AssertionError` with the offending messages spelled out, and
returns something useful when the check passes, so a test can go on asserting
about the shape it was handed back.

The side-effect log ("effects file") is a text file with one line per handler
execution, `tool_name call_id idempotency_key`, written by `append_effect`
(O_APPEND + fsync, one `write()` per line, so a killed writer leaves whole
lines only). It is what really happened; the history is what the store says
happened. The checks relate the two:

    history = await store.load_messages(session_id)
    turns = assert_well_formed(history, turns=3)
    assert_durability_errors_only_for(history, unsafe_tools={"post", "charge"})
    effects = read_effects(path)
    assert_at_most_once(effects, unsafe_tools={"post", "charge"})
    assert_effects_match_history(history, effects, session_id=..., safe_tools={"lookup"},
                                 unsafe_tools={"post", "charge"})
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from durable_agents import Message, ToolCall, ToolDurabilityError, idempotency_key


@dataclass(frozen=True, slots=True)
class Step:
    """One tool-call step: the assistant message asking for calls and their results."""

    assistant: Message
    results: tuple[Message, ...]

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self.assistant.tool_calls)


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn: its user message, its tool-call steps, and its final reply.

    `reply` is None only for an unfinished last turn (see
    `assert_well_formed(..., allow_unfinished=True)`).
    """

    user: Message
    steps: tuple[Step, ...]
    reply: Message | None


@dataclass(frozen=True, slots=True)
class Effect:
    """One line of the effects file: a handler ran for this call."""

    tool_name: str
    call_id: str
    idempotency_key: str


# -- the effects file -----------------------------------------------------------


def append_effect(path: str | os.PathLike[str], tool_name: str, call_id: str, key: str) -> None:
    """Record that a handler's side effect happened: one line, appended and fsynced."""
    for field in (tool_name, call_id, key):
        if not field or any(c.isspace() for c in field):
            raise ValueError(f"effect fields must be non-empty and without spaces: {field!r}")
    line = f"{tool_name} {call_id} {key}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):  # never seen for a short line on a local file; fail loudly
            raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_effects(path: str | os.PathLike[str]) -> list[Effect]:
    """Every effect recorded in the file, in order ([] if the file does not exist).

    Asserts that every line is whole: a torn line would mean the log itself
    cannot be trusted.
    """
    file = Path(path)
    if not file.exists():
        return []
    text = file.read_text()
    assert not text or text.endswith("\n"), f"effects file ends with a torn line: {text[-80:]!r}"
    effects = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split(" ")
        assert len(fields) == 3, f"effects line {number} is malformed: {line!r}"
        assert all(fields), f"effects line {number} has an empty field: {line!r}"
        effects.append(Effect(*fields))
    return effects


def effects_of_session(effects: Iterable[Effect], session_id: str) -> list[Effect]:
    """The effects that belong to `session_id` (recognised by their idempotency key)."""
    return [e for e in effects if e.idempotency_key == idempotency_key(session_id, e.call_id)]


# -- the history ----------------------------------------------------------------


def durability_errors(messages: Sequence[Message]) -> dict[str, ToolDurabilityError]:
    """The `ToolDurabilityError` results of the history, by tool call id."""
    found = {}
    for message in messages:
        error = ToolDurabilityError.from_message(message)
        if error is not None:
            assert message.tool_call_id is not None
            found[message.tool_call_id] = error
    return found


def stored_calls(messages: Sequence[Message]) -> dict[str, ToolCall]:
    """Every tool call the history holds, by id."""
    return {c.id: c for m in messages if m.role == "assistant" for c in m.tool_calls}


def results_by_call(messages: Sequence[Message]) -> dict[str, Message]:
    """Every tool result message of the history, by the call id it answers."""
    return {m.tool_call_id: m for m in messages if m.role == "tool" and m.tool_call_id}


def format_history(messages: Sequence[Message]) -> str:
    """A compact, numbered rendering of a history for assertion messages."""
    lines = []
    for seq, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            calls = ", ".join(f"{c.name}#{c.id}" for c in m.tool_calls)
            lines.append(f"  {seq:3} assistant calls [{calls}] {m.content[:40]!r}")
        elif m.role == "tool":
            kind = "DURABILITY-ERROR" if ToolDurabilityError.from_message(m) else "result"
            lines.append(f"  {seq:3} tool {m.tool_name}#{m.tool_call_id} {kind}")
        else:
            lines.append(f"  {seq:3} {m.role} {m.content[:60]!r}")
    return "\n".join(lines)


def assert_well_formed(
    messages: Sequence[Message],
    turns: int | None = None,
    *,
    user_messages: Sequence[str] | None = None,
    allow_unfinished: bool = False,
) -> list[Turn]:
    """Assert the history has the shape the run loop promises, and return its turns.

    - Only user, assistant and tool messages are stored (never the system message).
    - It is a sequence of turns: one user message, then zero or more steps,
      then a final reply (an assistant message without tool calls). A user
      message appears only at the start of a turn, so none is duplicated.
    - A step is an assistant message with tool calls followed *directly* by
      exactly one result per call, each naming its call's tool, in the order
      the kit stored them: in call order within one write, but the results of
      calls that waited for a person's decision (or were deferred) come in a
      later write than the step's other results, so in any order overall.
    - Tool call ids are non-empty and unique across the session.

    `turns`: the exact number of turns expected. `user_messages`: their exact
    texts. `allow_unfinished`: the last turn may lack its final reply, and its
    last step some of its results (none, after a crash between write #1 and
    write #2; only those of the calls that needed no decision, while others
    wait for one), as a history read between a crash and the resume that
    repairs it, or while a call awaits approval, does.
    """
    where = f"\nhistory:\n{format_history(messages)}"
    for seq, m in enumerate(messages):
        assert m.role in ("user", "assistant", "tool"), f"message {seq} has role {m.role!r}{where}"
    if not messages:
        assert not turns, f"expected {turns} turns, the history is empty"
        return []
    assert messages[0].role == "user", f"the history must start with a user message{where}"

    result: list[Turn] = []
    seen_ids: set[str] = set()
    i = 0
    while i < len(messages):
        start, user = i, messages[i]
        assert user.role == "user", f"message {i}: expected a turn's user message{where}"
        i += 1
        steps: list[Step] = []
        reply: Message | None = None
        while i < len(messages):
            m = messages[i]
            assert m.role == "assistant", (
                f"message {i}: expected an assistant message, got {m.role!r} "
                f"(a user message may only follow a final reply){where}"
            )
            i += 1
            if not m.tool_calls:
                reply = m
                break
            for call in m.tool_calls:
                assert call.id, f"message {i - 1}: a stored tool call has no id{where}"
                assert call.id not in seen_ids, f"tool call id {call.id!r} is reused{where}"
                seen_ids.add(call.id)
            calls = {c.id: c for c in m.tool_calls}
            step = i - 1
            results: list[Message] = []
            while i < len(messages) and messages[i].role == "tool":
                r = messages[i]
                call = calls.get(r.tool_call_id or "")
                assert call is not None, (
                    f"message {i}: the result of {r.tool_call_id!r} follows message {step}, "
                    f"which made no such call: the results of a step must follow it "
                    f"directly{where}"
                )
                assert all(r.tool_call_id != done.tool_call_id for done in results), (
                    f"message {i}: a second result for {r.tool_call_id!r}{where}"
                )
                assert r.tool_name == call.name, (
                    f"the result of {call.id!r} names tool {r.tool_name!r}, "
                    f"the call {call.name!r}{where}"
                )
                results.append(r)
                i += 1
            if len(results) < len(calls) and i == len(messages) and allow_unfinished:
                steps.append(Step(m, tuple(results)))  # its other results are still to come
                break
            assert len(results) == len(m.tool_calls), (
                f"message {step}: {len(m.tool_calls)} calls but only {len(results)} "
                f"results follow it directly{where}"
            )
            steps.append(Step(m, tuple(results)))
        if reply is None:
            assert allow_unfinished, f"turn {len(result)} (at {start}) has no final reply{where}"
            assert i == len(messages)  # only the last turn can lack its reply
        result.append(Turn(user, tuple(steps), reply))

    if turns is not None:
        assert len(result) == turns, f"expected {turns} turns, found {len(result)}{where}"
    if user_messages is not None:
        assert [t.user.content for t in result] == list(user_messages), (
            f"the turns' user messages differ from {list(user_messages)!r}{where}"
        )
    tool_messages = [m.tool_call_id for m in messages if m.role == "tool"]
    duplicated = [cid for cid, n in Counter(tool_messages).items() if n > 1]
    assert not duplicated, f"calls with more than one result: {duplicated}{where}"
    return result


def assert_durability_errors_only_for(
    messages: Sequence[Message], unsafe_tools: Collection[str]
) -> dict[str, ToolDurabilityError]:
    """Assert every ToolDurabilityError result answers a call of an unsafe tool,
    and names that call and tool. Returns the errors by call id."""
    calls = stored_calls(messages)
    errors = durability_errors(messages)
    for call_id, error in errors.items():
        call = calls.get(call_id)
        assert call is not None, f"a durability error answers unknown call {call_id!r}"
        assert call.name in unsafe_tools, (
            f"call {call_id!r} of tool {call.name!r} (not unsafe) got a durability error: "
            f"a safe_to_retry tool must be re-invoked instead"
        )
        assert (error.tool_name, error.tool_call_id) == (call.name, call_id), (
            f"the durability error for {call_id!r} names {error.tool_name!r}/{error.tool_call_id!r}"
        )
    return errors


def assert_at_most_once(effects: Iterable[Effect], unsafe_tools: Collection[str]) -> None:
    """Assert no call of an unsafe tool ran its handler more than once."""
    counts = Counter(e.call_id for e in effects if e.tool_name in unsafe_tools)
    twice = {cid: n for cid, n in counts.items() if n > 1}
    assert not twice, f"unsafe tool calls whose handler ran more than once: {twice}"


def assert_effects_match_history(
    messages: Sequence[Message],
    effects: Iterable[Effect],
    *,
    session_id: str,
    safe_tools: Collection[str],
    unsafe_tools: Collection[str],
) -> Counter[str]:
    """Assert the session's side effects agree with its (final, repaired) history.

    Considers only the effects of `session_id` (by idempotency key), so one
    effects file may serve many sessions.

    - Every effect is of a call the history stores, under the same tool name:
      no handler runs for a call that was not stored first.
    - Unsafe tools: at most once per call; exactly once when the stored
      result is real (not a durability error).
    - Safe tools: their stored result is real, and the handler ran at least
      once for it (more than once is allowed: that is what re-invocation is).

    Returns how many times each call id ran.
    """
    calls = stored_calls(messages)
    results = results_by_call(messages)
    errors = durability_errors(messages)
    mine = effects_of_session(effects, session_id)
    runs = Counter(e.call_id for e in mine)
    for effect in mine:
        call = calls.get(effect.call_id)
        assert call is not None, (
            f"handler {effect.tool_name!r} ran for call {effect.call_id!r}, which is not "
            f"stored: a call must be stored before its handler runs"
        )
        assert call.name == effect.tool_name, (
            f"call {effect.call_id!r} is stored as {call.name!r} but ran {effect.tool_name!r}"
        )
    for call_id, call in calls.items():
        assert call.name in safe_tools or call.name in unsafe_tools, f"unknown tool {call.name!r}"
        n = runs[call_id]
        if call.name in unsafe_tools:
            assert n <= 1, f"unsafe call {call.name}#{call_id} ran {n} times"
            if call_id in results and call_id not in errors:
                assert n == 1, (
                    f"unsafe call {call.name}#{call_id} has a real result but ran {n} times"
                )
        else:
            assert call_id not in errors, f"safe call {call.name}#{call_id} got a durability error"
            if call_id in results:
                assert n >= 1, f"safe call {call.name}#{call_id} has a result but never ran"
    return runs
