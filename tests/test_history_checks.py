"""The invariant checks of history_checks catch what they claim to (checking the checker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.history_checks import (
    Effect,
    append_effect,
    assert_at_most_once,
    assert_durability_errors_only_for,
    assert_effects_match_history,
    assert_well_formed,
    read_effects,
)

from durable_agents import Message, ToolCall, ToolDurabilityError, idempotency_key

SESSION = "s"
SAFE, UNSAFE = {"lookup"}, {"post"}
LOOKUP, POST = ToolCall("c1", "lookup", {}), ToolCall("c2", "post", {})


def good() -> list[Message]:
    return [
        Message.user("hi"),
        Message.assistant("", [LOOKUP, POST]),
        Message.tool_result(LOOKUP, "{}"),
        Message.tool_result(POST, "{}"),
        Message.assistant("done"),
    ]


def effect(call: ToolCall) -> Effect:
    return Effect(call.name, call.id, idempotency_key(SESSION, call.id))


def test_a_good_history_passes_and_is_split_into_turns() -> None:
    (turn,) = assert_well_formed(good(), turns=1, user_messages=["hi"])
    assert [s.calls for s in turn.steps] == [(LOOKUP, POST)]
    assert turn.reply == Message.assistant("done")
    runs = assert_effects_match_history(
        good(),
        [effect(LOOKUP), effect(LOOKUP), effect(POST)],
        session_id=SESSION,
        safe_tools=SAFE,
        unsafe_tools=UNSAFE,
    )
    assert runs == {"c1": 2, "c2": 1}


def test_results_in_the_order_the_kit_stores_them_pass() -> None:
    # A gated call declared first is answered last: the other calls' results land in
    # write #2, its own after the decision. Any order of one result per call is the
    # kit's to choose.
    history = [good()[0], good()[1], good()[3], good()[2], good()[4]]
    (turn,) = assert_well_formed(history, turns=1)
    assert [r.tool_call_id for r in turn.steps[0].results] == ["c2", "c1"]


OTHER = ToolCall("c3", "post", {})


@pytest.mark.parametrize(
    ("history", "error"),
    [
        (good()[:-1], "no final reply"),
        ([*good(), Message.user("hi"), Message.user("again")], "expected an assistant"),
        ([*good()[:2], good()[2], Message.assistant("x"), good()[3]], "results follow it direct"),
        ([*good()[:3], good()[2], *good()[3:]], "a second result for 'c1'"),
        ([*good()[:3], Message.tool_result(OTHER, "{}"), *good()[3:]], "made no such call"),
        ([*good(), Message.user("2"), good()[1], *good()[2:]], "reused"),
        ([good()[1], *good()[1:]], "start with a user message"),
    ],
    ids=["no-reply", "two-users", "interleaved", "twice", "stranger", "reused-id", "no-user"],
)
def test_malformed_histories_are_caught(history: list[Message], error: str) -> None:
    with pytest.raises(AssertionError, match=error):
        assert_well_formed(history)


def test_unfinished_last_turn_is_allowed_only_when_asked() -> None:
    cut = good()[:2]  # write #1 landed, write #2 did not
    with pytest.raises(AssertionError):
        assert_well_formed(cut)
    (turn,) = assert_well_formed(cut, allow_unfinished=True)
    assert turn.reply is None
    assert turn.steps[0].results == ()
    waiting = good()[:3]  # the lookup answered, the post waits for a person's decision
    (turn,) = assert_well_formed(waiting, allow_unfinished=True)
    assert [r.tool_call_id for r in turn.steps[0].results] == ["c1"]
    with pytest.raises(AssertionError, match="only 1 results"):
        assert_well_formed(waiting)


def test_durability_error_on_a_safe_tool_is_caught() -> None:
    history = good()
    history[2] = Message.tool_result(LOOKUP, ToolDurabilityError("lookup", "c1").to_content())
    with pytest.raises(AssertionError, match="not unsafe"):
        assert_durability_errors_only_for(history, UNSAFE)


@pytest.mark.parametrize(
    ("effects", "error"),
    [
        ([effect(LOOKUP), effect(POST), effect(POST)], "ran 2 times"),
        ([effect(LOOKUP)], "real result but ran 0 times"),
        ([effect(POST)], "has a result but never ran"),
        (
            [effect(LOOKUP), effect(POST), effect(ToolCall("c9", "post"))],
            "which is not stored",
        ),
    ],
    ids=["unsafe-twice", "unsafe-never", "safe-never", "unstored"],
)
def test_effects_disagreeing_with_the_history_are_caught(effects: list[Effect], error: str) -> None:
    with pytest.raises(AssertionError, match=error):
        assert_effects_match_history(
            good(), effects, session_id=SESSION, safe_tools=SAFE, unsafe_tools=UNSAFE
        )


def test_effects_of_other_sessions_are_ignored() -> None:
    other = Effect("post", "c9", idempotency_key("other", "c9"))
    assert_effects_match_history(
        good(),
        [effect(LOOKUP), effect(POST), other],
        session_id=SESSION,
        safe_tools=SAFE,
        unsafe_tools=UNSAFE,
    )


def test_at_most_once_and_the_effects_file(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    assert read_effects(path) == []
    append_effect(path, "post", "c2", "k2")
    append_effect(path, "post", "c2", "k2")
    effects = read_effects(path)
    assert effects == [Effect("post", "c2", "k2")] * 2
    assert_at_most_once(effects, {"charge"})
    with pytest.raises(AssertionError, match="more than once"):
        assert_at_most_once(effects, UNSAFE)
    with path.open("a") as f:
        f.write("post c3")
    with pytest.raises(AssertionError, match="torn"):
        read_effects(path)
    with pytest.raises(ValueError, match="without spaces"):
        append_effect(path, "post", "c 4", "k")
