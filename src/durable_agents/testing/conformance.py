"""One store conformance suite for every backend (memory, SQLite, D1, yours).

Each check is an async function taking a fresh, empty store and raising
AssertionError on a breach of the `Store` contract. Run them all:

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    async def test_store_contract(check):
        await check(my_store(clock=ticking_clock()))

The store must be built with a clock that advances between calls
(`ticking_clock()`), so the listing order is defined. Where the backends run it:
docs/testing.md ("The store conformance suite").
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Awaitable, Callable

from ..errors import (
    ConfigurationError,
    InvalidCursorError,
    MessageTooLargeError,
    SessionConflictError,
)
from ..messages import Message, ToolCall, Usage
from ..stores.base import ApprovalChange, Lease, Schedule, Store

Check = Callable[[Store], Awaitable[None]]


def ticking_clock(start: float = 1_800_000_000.0, step: float = 1.0) -> Callable[[], float]:
    """A clock that moves `step` seconds forward on every read."""
    now = [start - step]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def _step(n: int) -> list[Message]:
    """A tool-call step as the run loop writes it: assistant with calls + results."""
    calls = [ToolCall(f"c{n}a", "lookup", {"q": n}), ToolCall(f"c{n}b", "post", {"text": "x"})]
    return [
        Message.assistant(f"step {n}", calls, Usage(10 + n, 5)),
        Message.tool_result(calls[0], f'{{"n": {n}}}'),
        Message.tool_result(calls[1], "posted"),
    ]


async def _expect_conflict(write: Awaitable[int]) -> None:
    try:
        await write
    except SessionConflictError:
        return
    raise AssertionError("expected SessionConflictError")


async def unknown_session_is_empty(store: Store) -> None:
    assert await store.load_messages("nobody") == []
    assert await store.get_session("nobody") is None
    assert await store.delete_session("nobody") is False


async def round_trip_keeps_every_field(store: Store) -> None:
    call = ToolCall("toolu_01", "post", {"nested": {"list": [1, 2.5, None, True]}, "txt": "é€😀"})
    policy = {
        "source": "mcp:notes", "safe_to_retry": False, "requires_approval": True,
        "annotations": {"destructiveHint": True},
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }  # fmt: skip
    listed = ToolCall("toolu_02", "add_note", {"text": "x"}, provider_id="p/1", policy=policy)
    messages = [
        Message("user", "héllo 😀\nline two", request_key="req-1"),
        Message.assistant("", [call, listed], Usage(123, 45)),
        Message.tool_result(call, '{"error": "boom", "kind": "tool-failed"}'),
        Message.tool_result(listed, "added"),
        Message.assistant("done ✓", usage=Usage(0, 7)),
    ]
    assert await store.append_messages_atomic("s", 0, messages, agent_name="support") == 5
    stored = await store.load_messages("s")
    assert stored == messages
    assert stored[1].tool_calls[1].policy == policy  # a toolset call keeps what was decided


async def appends_keep_order(store: Store) -> None:
    expected = [Message.user("go")]
    assert await store.append_messages_atomic("s", 0, expected) == 1
    for n in range(5):
        step = _step(n)
        count = await store.append_messages_atomic("s", len(expected), step[:1])
        assert count == len(expected) + 1
        expected += step[:1]
        assert await store.append_messages_atomic("s", len(expected), step[1:]) == count + 2
        expected += step[1:]
    assert await store.load_messages("s") == expected


async def stale_writer_conflicts_and_writes_nothing(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("a"), Message.assistant("b")])
    before = await store.load_messages("s")
    await _expect_conflict(store.append_messages_atomic("s", 0, [Message.user("late")]))
    await _expect_conflict(store.append_messages_atomic("s", 1, [Message.user("late")]))
    assert await store.load_messages("s") == before


async def writer_ahead_of_history_conflicts(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("a")])
    await _expect_conflict(store.append_messages_atomic("s", 3, [Message.user("gap")]))
    await _expect_conflict(store.append_messages_atomic("new", 1, [Message.user("gap")]))
    assert await store.load_messages("s") == [Message.user("a")]
    assert await store.load_messages("new") == []


async def racing_writers_one_wins_whole(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")])
    first, second = _step(1), _step(2)
    outcomes = await asyncio.gather(
        store.append_messages_atomic("s", 1, first),
        store.append_messages_atomic("s", 1, second),
        return_exceptions=True,
    )
    conflicts = [o for o in outcomes if isinstance(o, SessionConflictError)]
    assert len(conflicts) == 1, outcomes
    winner = first if outcomes[0] == 4 else second
    assert await store.load_messages("s") == [Message.user("go"), *winner]


async def racing_creators_one_wins(store: Store) -> None:
    outcomes = await asyncio.gather(
        *(store.append_messages_atomic("s", 0, [Message.user(f"w{i}")]) for i in range(3)),
        return_exceptions=True,
    )
    assert sum(isinstance(o, SessionConflictError) for o in outcomes) == 2, outcomes
    assert len(await store.load_messages("s")) == 1


async def failing_batch_writes_nothing(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")])
    call = ToolCall("c1", "post", {})
    dup = [Message.assistant("", [call]), Message.tool_result(call, "a"),
           Message.tool_result(call, "b")]  # fmt: skip
    # A second result for one call breaks the one-result-per-call rule in the
    # middle of the batch: the rows before it must not land either.
    try:
        await store.append_messages_atomic("s", 1, dup)
    except SessionConflictError:
        pass
    else:
        raise AssertionError("a second result for one tool call was accepted")
    assert await store.load_messages("s") == [Message.user("go")]


async def a_request_key_starts_one_turn_only(store: Store) -> None:
    first = [Message("user", "go", request_key="k1"), Message.assistant("done")]
    await store.append_messages_atomic("s", 0, first)
    await _expect_conflict(
        store.append_messages_atomic("s", 2, [Message("user", "go", request_key="k1")])
    )
    await store.append_messages_atomic("other", 0, [Message("user", "go", request_key="k1")])
    assert await store.load_messages("s") == first


async def oversized_row_writes_nothing(store: Store) -> None:
    big = Message.user("x" * 2_100_000)
    try:
        await store.append_messages_atomic("s", 0, [Message.user("first"), big])
    except MessageTooLargeError as exc:
        if exc.size <= exc.limit:
            raise AssertionError(f"size {exc.size} reported under limit {exc.limit}") from exc
    else:
        raise AssertionError("a 2.1 MB row was accepted")
    assert await store.load_messages("s") == []
    assert await store.get_session("s") is None


async def large_rows_near_the_limit_round_trip(store: Store) -> None:
    call = ToolCall("c1", "fetch", {"blob": "a" * 100_000})
    messages = [
        Message.user("u" * 1_800_000),
        Message.assistant("", [call]),
        Message.tool_result(call, "é" * 900_000),  # 1.8 MB of UTF-8
    ]
    await store.append_messages_atomic("s", 0, messages)
    assert await store.load_messages("s") == messages


async def pages_of_messages_start_where_asked(store: Store) -> None:
    messages = [Message.user("q"), *_step(1), Message.assistant("a")]
    await store.append_messages_atomic("s", 0, messages)
    assert await store.load_messages("s", start=2) == messages[2:]
    assert await store.load_messages("s", start=1, limit=2) == messages[1:3]
    assert await store.load_messages("s", start=0, limit=0) == []
    assert await store.load_messages("s", start=-5, limit=1) == messages[:1]
    assert await store.load_messages("s", start=99) == []
    assert await store.load_messages("nobody", start=1, limit=1) == []


async def context_begins_where_the_latest_summary_says(store: Store) -> None:
    assert await store.load_context("nobody") == (0, [])
    first = [Message.user("q1"), *_step(1), Message.assistant("a1")]
    await store.append_messages_atomic("s", 0, first)
    assert await store.load_context("s") == (0, first)
    summary = Message.summary("q1 was answered", 4)
    second = [summary, Message.user("q2"), Message.assistant("a2")]
    await store.append_messages_atomic("s", 5, second)
    stored = await store.load_messages("s")
    assert stored[5] == summary
    assert stored[5].summary_of == 4
    assert await store.load_context("s") == (4, stored[4:])
    later = Message.summary("both answered", 6)
    await store.append_messages_atomic("s", 8, [later, Message.user("q3")])
    base, tail = await store.load_context("s")
    assert base == 6
    assert tail == (await store.load_messages("s"))[6:]


async def a_request_is_found_by_its_key(store: Store) -> None:
    assert await store.find_request("s", "k1") is None
    await store.append_messages_atomic("s", 0, [Message.user("no key"), Message.assistant("a")])
    keyed = Message("user", "with key", request_key="k1")
    await store.append_messages_atomic("s", 2, [keyed, Message.assistant("b")])
    assert await store.find_request("s", "k1") == (2, "with key")
    assert await store.find_request("s", "k2") is None
    assert await store.find_request("other", "k1") is None


async def sessions_are_isolated(store: Store) -> None:
    await store.append_messages_atomic("a", 0, [Message.user("for a")])
    await store.append_messages_atomic("b", 0, [Message.user("for b")])
    assert await store.load_messages("a") == [Message.user("for a")]
    assert await store.load_messages("b") == [Message.user("for b")]


async def session_info_tracks_writes(store: Store) -> None:
    await store.append_messages_atomic("s", 0, _step(0)[:1], agent_name="support")
    info = await store.get_session("s")
    assert info is not None
    assert (info.id, info.agent_name, info.message_count) == ("s", "support", 1)
    assert info.state == "awaiting_tool_results"
    await store.append_messages_atomic("s", 1, _step(0)[1:])
    await store.append_messages_atomic("s", 3, [Message.assistant("bye")])
    later = await store.get_session("s")
    assert later is not None
    assert (later.agent_name, later.message_count, later.state) == ("support", 4, "idle")
    assert later.created_at == info.created_at < later.updated_at


async def list_sessions_newest_first(store: Store) -> None:
    for name in ("s1", "s2", "s3"):
        await store.append_messages_atomic(name, 0, [Message.user(name)])
    await store.append_messages_atomic("s1", 1, [Message.assistant("again")])
    page = await store.list_sessions()
    # Newest CREATED first: a later write does not move a session.
    assert [info.id for info in page.sessions] == ["s3", "s2", "s1"]
    assert page.next_cursor is None
    assert page.sessions[2].message_count == 2


async def listing_filters_by_agent(store: Store) -> None:
    # One Worker, several agents: the listing of one agent's sessions (by agent_name).
    for i, agent in enumerate(["support", "refunds", "support", None, "refunds", "support"]):
        await store.append_messages_atomic(f"s{i}", 0, [Message.user("hi")], agent_name=agent)
    page = await store.list_sessions(agent_name="support", limit=2)
    assert [info.id for info in page.sessions] == ["s5", "s2"], page
    assert page.next_cursor is not None
    rest = await store.list_sessions(agent_name="support", limit=2, cursor=page.next_cursor)
    assert ([info.id for info in rest.sessions], rest.next_cursor) == (["s0"], None), rest
    refunds = await store.list_sessions(agent_name="refunds")
    assert [info.id for info in refunds.sessions] == ["s4", "s1"], refunds
    assert (await store.list_sessions(agent_name="nobody")).sessions == []
    assert len((await store.list_sessions()).sessions) == 6


async def session_names_are_stored_once(store: Store) -> None:
    await store.append_messages_atomic("id-1", 0, [Message.user("a")], session_name="alpha")
    # A later append's name is ignored: the name is the creating write's.
    await store.append_messages_atomic("id-1", 1, [Message.assistant("b")], session_name="beta")
    await store.append_messages_atomic("id-2", 0, [Message.user("c")])  # no name: its id
    one, two = await store.get_session("id-1"), await store.get_session("id-2")
    assert one is not None
    assert one.name == "alpha", one
    assert two is not None
    assert two.name == "id-2", two
    listed = {i.id: i.name for i in (await store.list_sessions()).sessions}
    assert listed == {"id-1": "alpha", "id-2": "id-2"}, listed
    # A refused append (a stale position) creates nothing and names nothing.
    await _expect_conflict(
        store.append_messages_atomic("id-3", 1, [Message.user("x")], session_name="gamma")
    )
    assert await store.find_sessions("gamma") == []


async def usage_totals_are_summed_by_the_appends(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("hi")])
    info = await store.get_session("s")
    assert info is not None
    assert (info.input_tokens, info.output_tokens) == (0, 0), info
    await store.append_messages_atomic("s", 1, _step(1))  # Usage(11, 5)
    await store.append_messages_atomic(
        "s", 4, [Message.assistant("done", usage=Usage(100, 7)), Message.user("more")]
    )
    await store.append_messages_atomic("s", 6, _step(2))  # Usage(12, 5)
    # A refused append adds nothing; an approvals-only append adds nothing.
    await _expect_conflict(
        store.append_messages_atomic("s", 2, [Message.assistant("late", usage=Usage(1000, 1000))])
    )
    await store.append_messages_atomic("s", 9, [], approvals=[_request("c2a")])
    info = await store.get_session("s")
    assert info is not None
    assert (info.input_tokens, info.output_tokens) == (123, 17), info
    stored = [m.usage for m in await store.load_messages("s") if m.usage]
    assert sum(u.input_tokens for u in stored) == info.input_tokens
    assert sum(u.output_tokens for u in stored) == info.output_tokens
    listed = (await store.list_sessions()).sessions[0]
    found = (await store.find_sessions("s"))[0]
    assert (listed.input_tokens, found.output_tokens) == (123, 17)


async def listing_pages_by_cursor_newest_created_first(store: Store) -> None:
    for n in range(1, 6):
        await store.append_messages_atomic(f"s{n}", 0, [Message.user(str(n))])
    first = await store.list_sessions(limit=2)
    assert [i.id for i in first.sessions] == ["s5", "s4"]
    assert isinstance(first.next_cursor, str)
    assert first.next_cursor
    # Written while paging: updates do not move a session, new ones are newer
    # than every cursor, so the pages go on exactly where they were.
    await store.append_messages_atomic("s2", 1, [Message.assistant("updated")])
    await store.append_messages_atomic("s6", 0, [Message.user("new")])
    second = await store.list_sessions(limit=2, cursor=first.next_cursor)
    assert [i.id for i in second.sessions] == ["s3", "s2"]
    assert second.sessions[1].message_count == 2
    assert second.next_cursor is not None
    last = await store.list_sessions(limit=2, cursor=second.next_cursor)
    assert [i.id for i in last.sessions] == ["s1"]
    assert last.next_cursor is None
    # A limit that ends exactly at the last session has no next page.
    whole = await store.list_sessions(limit=6)
    assert [i.id for i in whole.sessions] == ["s6", "s5", "s4", "s3", "s2", "s1"]
    assert whole.next_cursor is None
    assert (await store.list_sessions(limit=1000)).sessions == whole.sessions
    # The same cursor reads the same page again.
    again = await store.list_sessions(limit=2, cursor=first.next_cursor)
    assert [i.id for i in again.sessions] == ["s3", "s2"]
    assert (await store.list_sessions()).sessions == whole.sessions  # default limit 50
    empty_after = await store.list_sessions(limit=1, cursor=last.next_cursor)
    assert empty_after.sessions == [whole.sessions[0]]  # None is the first page


async def a_bad_cursor_or_limit_is_refused(store: Store) -> None:
    await store.append_messages_atomic("s1", 0, [Message.user("a")])
    await store.append_messages_atomic("s2", 0, [Message.user("b")])
    good = (await store.list_sessions(limit=1)).next_cursor
    assert good is not None
    bad = [
        "", "!!!", "not a cursor", "e30", good + "=", good[:-2], good + "A", " " + good,
        _b64(b"[1,2]"), _b64(b'["1","s"]'), _b64(b'[-1,"s"]'), _b64(b'[true,"s"]'),
        _b64(b'[1,"s",3]'), _b64(b'{"created_at":1}'), _b64(b"\xff\xfe"), _b64(b'[1.5,"s"]'),
        _b64(b'[ 1, "s"]'), "A" * 5000,
    ]  # fmt: skip
    for cursor in bad:
        try:
            await store.list_sessions(limit=1, cursor=cursor)
        except InvalidCursorError as exc:
            refused: InvalidCursorError = exc
        else:
            raise AssertionError(f"cursor {cursor[:40]!r} was accepted")
        assert refused.code == "invalid-cursor"
        assert isinstance(refused, ConfigurationError)
    for limit in (0, -1):
        try:
            await store.list_sessions(limit=limit)
        except ConfigurationError:
            continue
        raise AssertionError(f"limit={limit} was accepted")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def find_sessions_by_name(store: Store) -> None:
    await store.append_messages_atomic("a", 0, [Message.user("1")], session_name="support")
    await store.append_messages_atomic("b", 0, [Message.user("2")], session_name="other")
    await store.append_messages_atomic("c", 0, [Message.user("3")], session_name="support")
    await store.append_messages_atomic("a", 1, [Message.assistant("later")])
    found = await store.find_sessions("support")
    assert [i.id for i in found] == ["c", "a"], found
    assert found[1].message_count == 2
    assert found[1].name == "support"
    assert [i.id for i in await store.find_sessions("other")] == ["b"]
    assert await store.find_sessions("nobody") == []
    assert await store.find_sessions("Support") == []  # names match exactly
    await store.delete_session("c")
    assert [i.id for i in await store.find_sessions("support")] == ["a"]


async def delete_session_is_whole_and_a_later_append_conflicts(store: Store) -> None:
    await store.append_messages_atomic(
        "s", 0, [Message.user("q"), *_step(1)], approvals=[_request("c1a")],
        session_name="doomed",
    )  # fmt: skip
    assert await store.acquire_lease("s", "run-1", HOUR_MS) is None
    await store.append_messages_atomic("keep", 0, [Message.user("other")])
    assert await store.delete_session("s") is True
    assert await store.get_session("s") is None
    assert await store.load_messages("s") == []
    assert await store.load_timeline("s") == []
    assert await store.load_approvals("s") == []
    assert await store.find_sessions("doomed") == []
    assert [i.id for i in (await store.list_sessions()).sessions] == ["keep"]
    assert await store.acquire_lease("s", "run-2", HOUR_MS) is None  # the lease went too
    await store.release_lease("s", "run-2")
    # The run that was writing to it: its next append expects position 4.
    await _expect_conflict(
        store.append_messages_atomic("s", 4, [Message.assistant("late")], lease=Lease("run-1", 1))
    )
    assert await store.load_messages("s") == []
    assert await store.get_session("s") is None
    assert await store.delete_session("s") is False
    assert await store.load_messages("keep") == [Message.user("other")]


async def delete_idle_deletes_the_oldest_idle_up_to_the_limit(store: Store) -> None:
    for name in ("a", "b", "c", "d"):
        await store.append_messages_atomic(name, 0, [Message.user(name)])
    await store.append_messages_atomic(
        "b", 1, [Message.assistant("still here")], approvals=[_request("x")]
    )
    await store.acquire_lease("c", "run", HOUR_MS)
    d = await store.get_session("d")
    assert d is not None
    # Idle before d's last write: a, then c (b was written after d).
    assert await store.delete_idle(d.updated_at - 10**9) == 0
    assert await store.delete_idle(d.updated_at, limit=1) == 1
    assert await store.get_session("a") is None
    assert await store.load_messages("a") == []
    assert await store.get_session("c") is not None
    assert await store.delete_idle(d.updated_at, limit=5) == 1
    assert await store.load_messages("c") == []
    assert await store.acquire_lease("c", "other", HOUR_MS) is None  # c's lease went too
    assert await store.delete_idle(d.updated_at, limit=5) == 0
    assert sorted(i.id for i in (await store.list_sessions()).sessions) == ["b", "d"]
    assert len(await store.load_approvals("b")) == 1
    # Up to `limit`, oldest first, then the rest on the next call.
    assert await store.delete_idle(d.updated_at + 10**9, limit=1) == 1
    assert [i.id for i in (await store.list_sessions()).sessions] == ["b"]
    assert await store.delete_idle(d.updated_at + 10**9, limit=1) == 1
    assert await store.load_approvals("b") == []
    assert await store.delete_idle(d.updated_at + 10**9) == 0
    try:
        await store.delete_idle(d.updated_at, limit=0)
    except ConfigurationError:
        return
    raise AssertionError("delete_idle(limit=0) was accepted")


async def load_timeline_gives_each_message_its_time(store: Store) -> None:
    assert await store.load_timeline("nobody") == []
    await store.append_messages_atomic("s", 0, [Message.user("q")])
    await store.append_messages_atomic("s", 1, _step(1))
    await store.append_messages_atomic("s", 4, [Message.assistant("done", usage=Usage(1, 2))])
    timeline = await store.load_timeline("s")
    assert [m for _, m in timeline] == await store.load_messages("s")
    times = [t for t, _ in timeline]
    info = await store.get_session("s")
    assert info is not None
    assert times[0] == info.created_at
    assert times[-1] == info.updated_at
    assert times[0] < times[1] == times[2] == times[3] < times[4], times  # one append, one time
    assert all(isinstance(t, int) for t in times)


async def pages_of_the_timeline_start_where_asked(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("q")])
    await store.append_messages_atomic("s", 1, [*_step(1), Message.assistant("a")])
    whole = await store.load_timeline("s")
    assert len(whole) == 5
    assert await store.load_timeline("s", start=2) == whole[2:]
    assert await store.load_timeline("s", start=1, limit=2) == whole[1:3]
    assert await store.load_timeline("s", start=0, limit=0) == []
    assert await store.load_timeline("s", start=-5, limit=1) == whole[:1]
    assert await store.load_timeline("s", start=99) == []
    assert await store.load_timeline("s", start=4, limit=10) == whole[4:]
    assert await store.load_timeline("nobody", start=1, limit=1) == []
    pages = [await store.load_timeline("s", start=s, limit=2) for s in range(0, 5, 2)]
    assert [e for page in pages for e in page] == whole


async def delete_removes_everything(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("a"), Message.assistant("b")])
    await store.append_messages_atomic("other", 0, [Message.user("keep")])
    assert await store.delete_session("s") is True
    assert await store.load_messages("s") == []
    assert await store.get_session("s") is None
    assert await store.load_messages("other") == [Message.user("keep")]
    # A deleted session starts again from position 0.
    await store.append_messages_atomic("s", 0, [Message.user("again")])
    assert await store.load_messages("s") == [Message.user("again")]


async def empty_append_is_refused(store: Store) -> None:
    try:
        await store.append_messages_atomic("s", 0, [])
    except ValueError:
        return
    raise AssertionError("an empty append was accepted")


HOUR_MS = 3_600_000


async def a_lease_has_one_holder_until_released_expired_or_taken(store: Store) -> None:
    assert await store.acquire_lease("s", "a", HOUR_MS) is None
    held = await store.acquire_lease("s", "b", HOUR_MS)
    assert held is not None, "a second owner took a held lease"
    assert held.owner == "a", held
    assert await store.acquire_lease("s", "a", HOUR_MS) is None  # its holder renews it
    await store.release_lease("s", "b")  # not b's: nothing happens
    assert (await store.acquire_lease("s", "b", HOUR_MS)) is not None
    # A holder known to be dead is replaced at once, and only that holder.
    assert (await store.acquire_lease("s", "b", HOUR_MS, take_from="zz")) is not None
    assert await store.acquire_lease("s", "b", HOUR_MS, take_from="a") is None
    await store.release_lease("s", "b")
    assert await store.acquire_lease("s", "c", HOUR_MS) is None
    # The store's clock moves on at every read: a 1 ms lease is over at the next call.
    assert await store.acquire_lease("t", "a", 1) is None
    assert await store.acquire_lease("t", "b", HOUR_MS) is None
    # A lease is not a session.
    assert await store.get_session("s") is None
    assert await store.load_messages("s") == []
    assert (await store.list_sessions()).sessions == []


async def racing_lease_takers_one_wins(store: Store) -> None:
    results = await asyncio.gather(
        *(store.acquire_lease("s", f"owner{i}", HOUR_MS) for i in range(6))
    )
    assert sum(r is None for r in results) == 1, results


async def appends_renew_and_release_the_lease(store: Store) -> None:
    assert await store.acquire_lease("s", "a", 5_000) is None
    await store.append_messages_atomic("s", 0, [Message.user("go")], lease=Lease("a", HOUR_MS))
    held = await store.acquire_lease("s", "b", HOUR_MS)
    assert held is not None, "the append did not renew the lease"
    assert held.owner == "a", held
    # Another owner's lease in an append changes nothing.
    await store.append_messages_atomic(
        "s", 1, [Message.assistant("x")], lease=Lease("b", 1, release=True)
    )
    assert (await store.acquire_lease("s", "b", HOUR_MS)) is not None
    await store.append_messages_atomic(
        "s", 2, [Message.user("y")], lease=Lease("a", HOUR_MS, release=True)
    )
    assert await store.acquire_lease("s", "b", HOUR_MS) is None
    # A conflicting append changes no lease either.
    await _expect_conflict(
        store.append_messages_atomic(
            "s", 0, [Message.user("stale")], lease=Lease("b", HOUR_MS, release=True)
        )
    )
    assert (await store.acquire_lease("s", "c", HOUR_MS)) is not None


async def delete_removes_the_lease(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("a")])
    assert await store.acquire_lease("s", "a", HOUR_MS) is None
    assert await store.delete_session("s") is True
    assert await store.acquire_lease("s", "b", HOUR_MS) is None


def _request(call_id: str, digest: str = "d1") -> ApprovalChange:
    return ApprovalChange(call_id, "requested", digest, tool_name="refund")


async def approval_events_land_only_when_their_condition_holds(store: Store) -> None:
    call = ToolCall("r1", "refund", {"amount": 5})
    await store.append_messages_atomic(
        "s", 0, [Message.user("go"), Message.assistant("", [call])], approvals=[_request("r1")]
    )
    refused = [
        ApprovalChange("r1", "approved", "other-digest"),  # not what was requested
        ApprovalChange("r9", "approved", "d1"),  # never requested
        ApprovalChange("r1", "claimed", "d1"),  # not approved yet
    ]
    for change in refused:
        await _expect_conflict(store.append_messages_atomic("s", 2, [], approvals=[change]))
    assert [e.event for e in await store.load_approvals("s")] == ["requested"]
    # A decision alone is not positional: it lands whatever the position given.
    decided = ApprovalChange("r1", "approved", "d1", reason="ok by ann")
    assert await store.append_messages_atomic("s", 2, [], approvals=[decided]) == 2
    await _expect_conflict(
        store.append_messages_atomic("s", 2, [], approvals=[ApprovalChange("r1", "denied", "d1")])
    )
    claim = ApprovalChange("r1", "claimed", "d1")
    await store.append_messages_atomic("s", 2, [], approvals=[claim])
    await _expect_conflict(store.append_messages_atomic("s", 2, [], approvals=[claim]))
    events = await store.load_approvals("s")
    assert [(e.tool_call_id, e.event, e.tool_name, e.digest, e.reason) for e in events] == [
        ("r1", "requested", "refund", "d1", None),
        ("r1", "approved", "refund", "d1", "ok by ann"),
        ("r1", "claimed", "refund", "d1", None),
    ]
    assert await store.load_messages("s") == [Message.user("go"), Message.assistant("", [call])]
    # A denied call cannot be claimed.
    await store.append_messages_atomic("t", 0, [Message.user("x")], approvals=[_request("r2")])
    await store.append_messages_atomic("t", 1, [], approvals=[ApprovalChange("r2", "denied", "d1")])
    await _expect_conflict(
        store.append_messages_atomic("t", 1, [], approvals=[ApprovalChange("r2", "claimed", "d1")])
    )


async def an_append_with_a_refused_approval_writes_nothing(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")], approvals=[_request("r1")])
    # The request repeats: the messages of the same append do not land either.
    await _expect_conflict(
        store.append_messages_atomic("s", 1, [Message.assistant("x")], approvals=[_request("r1")])
    )
    assert await store.load_messages("s") == [Message.user("go")]
    assert len(await store.load_approvals("s")) == 1


async def racing_deciders_one_wins(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")], approvals=[_request("r1")])
    decisions = [
        ApprovalChange("r1", "approved" if i % 2 else "denied", "d1", reason=str(i))
        for i in range(6)
    ]
    outcomes = await asyncio.gather(
        *(store.append_messages_atomic("s", 1, [], approvals=[d]) for d in decisions),
        return_exceptions=True,
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1, outcomes
    assert all(
        isinstance(o, SessionConflictError) for o in outcomes if isinstance(o, BaseException)
    ), outcomes
    assert len(await store.load_approvals("s")) == 2


async def delete_removes_the_approvals(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")], approvals=[_request("r1")])
    assert await store.delete_session("s") is True
    assert await store.load_approvals("s") == []


def _fire(schedule: Schedule, origin: str = "scheduled") -> Message:
    """The user message a scheduled turn begins with."""
    return Message("user", schedule.message, request_key=schedule.request_key, origin=origin)  # type: ignore[arg-type]


async def schedules_are_stored_with_an_append_and_listed_earliest_first(store: Store) -> None:
    late, soon = Schedule("late", "remind me", 5_000, 1_000), Schedule("soon", "ping", 2_000, 1_000)
    assert await store.append_messages_atomic("s", 0, [Message.user("hi")], schedules=[late]) == 1
    assert await store.append_messages_atomic("s", 1, [], schedules=[soon]) == 1  # not positional
    assert await store.load_schedules("s") == [soon, late]
    assert await store.load_schedules("other") == []
    assert (await store.load_messages("s"))[0].origin is None


async def a_schedule_fires_once_with_its_turns_first_write(store: Store) -> None:
    schedule = Schedule("x1", "send the reminder", 2_000, 1_000)
    await store.append_messages_atomic("s", 0, [Message.user("hi")], schedules=[schedule])
    fired = _fire(schedule)
    assert await store.append_messages_atomic("s", 1, [fired, Message.assistant("done")]) == 3
    assert await store.load_schedules("s") == []
    stored = await store.load_messages("s")
    assert stored[1] == fired, stored
    assert stored[1].origin == "scheduled", stored
    # Fired already: another run firing it again lands nothing.
    await _expect_conflict(store.append_messages_atomic("s", 3, [_fire(schedule)]))
    assert len(await store.load_messages("s")) == 3


async def a_cancelled_schedule_never_fires(store: Store) -> None:
    schedule = Schedule("x2", "later", 2_000, 1_000)
    await store.append_messages_atomic("s", 0, [Message.user("hi")], schedules=[schedule])
    assert await store.delete_schedule("s", "x2") is True
    assert await store.delete_schedule("s", "x2") is False
    await _expect_conflict(store.append_messages_atomic("s", 1, [_fire(schedule)]))
    assert len(await store.load_messages("s")) == 1
    # A client's own key that merely looks like a schedule's is an ordinary message.
    plain = Message("user", "mine", request_key="schedule:x2")
    assert await store.append_messages_atomic("s", 1, [plain]) == 2


async def a_recurring_schedule_runs_each_occurrence_once_and_moves_on(store: Store) -> None:
    every = Schedule("r1", "tick", 60_000, 1_000, rule='{"every_seconds":60}')
    await store.append_messages_atomic("s", 0, [Message.user("hi")], schedules=[every])
    assert every.request_key == "schedule:r1@60000"
    # Its occurrence's first write stores the message and moves the row, as one.
    moved = dataclasses.replace(every, due_at=120_000)
    fired = _fire(every)
    assert await store.append_messages_atomic("s", 1, [fired], schedules=[moved]) == 2
    assert await store.load_schedules("s") == [moved]
    assert (await store.load_messages("s"))[1] == fired
    # That occurrence again (another worker, a replay), whatever it would move the row to:
    # nothing lands, the row stays where the first firing put it.
    for again in ([], [moved], [dataclasses.replace(every, due_at=180_000)]):
        await _expect_conflict(store.append_messages_atomic("s", 2, [fired], schedules=again))
    # A one-off's key for it fires nothing either.
    await _expect_conflict(
        store.append_messages_atomic("s", 2, [_fire(dataclasses.replace(every, rule=None))])
    )
    assert await store.load_schedules("s") == [moved]
    assert len(await store.load_messages("s")) == 2
    # The next occurrence fires once in turn.
    later = dataclasses.replace(every, due_at=180_000)
    next_turn = [_fire(moved), Message.assistant("ok")]
    await store.append_messages_atomic("s", 2, next_turn, schedules=[later])
    assert await store.load_schedules("s") == [later]
    assert [m.request_key for m in await store.load_messages("s")] == [
        None, "schedule:r1@60000", "schedule:r1@120000", None,
    ]  # fmt: skip


async def a_deleted_recurring_schedule_fires_no_waiting_occurrence(store: Store) -> None:
    every = Schedule("r2", "tick", 60_000, 1_000, rule='{"cron":"* * * * *","timezone":"UTC"}')
    await store.append_messages_atomic("s", 0, [Message.user("hi")], schedules=[every])
    assert await store.load_schedules("s") == [every]  # its rule kept as given
    assert await store.delete_schedule("s", "r2") is True
    moved = dataclasses.replace(every, due_at=120_000)
    await _expect_conflict(store.append_messages_atomic("s", 1, [_fire(every)], schedules=[moved]))
    assert await store.load_schedules("s") == []
    assert len(await store.load_messages("s")) == 1


async def delete_removes_the_schedules(store: Store) -> None:
    schedule = Schedule("x3", "later", 2_000, 1_000)
    await store.append_messages_atomic("s", 0, [Message.user("hi")], schedules=[schedule])
    assert await store.delete_session("s") is True
    assert await store.load_schedules("s") == []


async def instructions_round_trip_on_a_user_message_and_a_summary(store: Store) -> None:
    first = [
        Message("user", "q1", request_key="k1", instructions="Be brief.\nToday is 2027-01-15 😀"),
        Message.assistant("a1"),
        Message.user("q2"),  # fixed instructions: none stored
        Message.assistant("a2"),
    ]
    await store.append_messages_atomic("s", 0, first)
    summary = Message("system", "q1 and q2 answered", summary_of=4, instructions="Be brief.")
    later = Message("user", "q3", instructions="")  # empty, yet stored: not None
    odd = Message("user", "q4", instructions="a\ud800b\x00\x01")  # stored as valid UTF-8
    await store.append_messages_atomic("s", 4, [summary, later, odd])
    stored = await store.load_messages("s")
    assert stored == [*first, summary, later, odd], stored
    assert [m.instructions for m in stored] == [
        "Be brief.\nToday is 2027-01-15 😀", None, None, None, "Be brief.", "", "a\ufffdb\x00\x01",
    ]  # fmt: skip
    assert await store.load_context("s") == (4, [summary, later, odd])
    assert [m for _, m in await store.load_timeline("s")] == stored
    # They count toward the row limit, with the content.
    half = "x" * 1_000_000
    try:
        await store.append_messages_atomic("s", 7, [Message("user", half, instructions=half)])
    except MessageTooLargeError:
        pass
    else:
        raise AssertionError("a user message and its instructions over the row limit were kept")
    assert len(await store.load_messages("s")) == 7


async def an_approval_keeps_the_approvers_edited_arguments(store: Store) -> None:
    await store.append_messages_atomic(
        "s", 0, [Message.user("go")], approvals=[_request("r1"), _request("r2")]
    )
    # Kept as sent: key order, nesting, text JSON must escape.
    edited = {"order_id": "A-1", "amount_cents": 2500, "note": 'é "😀"\n', "items": [{"n": 1}]}
    approved = ApprovalChange(
        "r1", "approved", "d1", reason="ann: less", arguments=edited, arguments_digest="e1"
    )
    await store.append_messages_atomic("s", 1, [], approvals=[approved])
    denied = ApprovalChange("r2", "denied", "d1", reason="no")
    await store.append_messages_atomic("s", 1, [], approvals=[denied])
    await store.append_messages_atomic(
        "s", 1, [], approvals=[ApprovalChange("r1", "claimed", "d1")]
    )
    events = await store.load_approvals("s")
    assert [(e.tool_call_id, e.event, e.arguments, e.arguments_digest) for e in events] == [
        ("r1", "requested", None, None),
        ("r2", "requested", None, None),
        ("r1", "approved", edited, "e1"),
        ("r2", "denied", None, None),
        ("r1", "claimed", None, None),
    ], events
    assert events[2].arguments is not None
    assert list(events[2].arguments) == list(edited)  # the keys in the order sent
    assert (events[2].tool_name, events[2].digest, events[2].reason) == (
        "refund",
        "d1",
        "ann: less",
    )


async def only_an_approval_carries_edited_arguments(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")], approvals=[_request("r1")])
    refused = [
        ApprovalChange("r1", "denied", "d1", arguments={"a": 1}, arguments_digest="e"),
        ApprovalChange("r2", "requested", "d2", "refund", arguments={"a": 1}, arguments_digest="e"),
        ApprovalChange("r1", "approved", "d1", arguments={"a": 1}),  # no digest of them
        ApprovalChange("r1", "approved", "d1", arguments_digest="e"),  # a digest of nothing
        ApprovalChange("r1", "approved", "d1", arguments={"a": float("nan")}, arguments_digest="e"),
    ]
    for change in refused:
        try:
            await store.append_messages_atomic("s", 1, [Message.user("x")], approvals=[change])
        except ConfigurationError:
            continue
        raise AssertionError(f"{change} was accepted")
    assert [e.event for e in await store.load_approvals("s")] == ["requested"]
    assert await store.load_messages("s") == [Message.user("go")]
    # Decided without an edit: a plain approval, nothing extra stored.
    await store.append_messages_atomic(
        "s", 1, [], approvals=[ApprovalChange("r1", "approved", "d1")]
    )
    decided = (await store.load_approvals("s"))[-1]
    assert (decided.event, decided.arguments, decided.arguments_digest) == ("approved", None, None)


async def origins_round_trip(store: Store) -> None:
    await _expect_conflict(  # a scheduled turn's message names a stored schedule
        store.append_messages_atomic("s", 0, [Message("user", "x", origin="scheduled")])
    )
    messages = [
        Message("user", "x"),
        Message("assistant", "z", origin="scheduled"),
        Message("assistant", "y", origin="self-resumed"),
        Message("assistant", "stopped", origin="stopped"),
    ]
    await store.append_messages_atomic("s", 0, messages)
    assert await store.load_messages("s") == messages
    info = await store.get_session("s")
    assert info is not None, info
    assert info.state == "stopped", info


CHECKS: tuple[Check, ...] = (
    unknown_session_is_empty,
    round_trip_keeps_every_field,
    appends_keep_order,
    stale_writer_conflicts_and_writes_nothing,
    writer_ahead_of_history_conflicts,
    racing_writers_one_wins_whole,
    racing_creators_one_wins,
    failing_batch_writes_nothing,
    a_request_key_starts_one_turn_only,
    oversized_row_writes_nothing,
    large_rows_near_the_limit_round_trip,
    sessions_are_isolated,
    pages_of_messages_start_where_asked,
    context_begins_where_the_latest_summary_says,
    a_request_is_found_by_its_key,
    session_info_tracks_writes,
    list_sessions_newest_first,
    listing_filters_by_agent,
    session_names_are_stored_once,
    usage_totals_are_summed_by_the_appends,
    listing_pages_by_cursor_newest_created_first,
    a_bad_cursor_or_limit_is_refused,
    find_sessions_by_name,
    delete_session_is_whole_and_a_later_append_conflicts,
    delete_idle_deletes_the_oldest_idle_up_to_the_limit,
    load_timeline_gives_each_message_its_time,
    pages_of_the_timeline_start_where_asked,
    delete_removes_everything,
    empty_append_is_refused,
    a_lease_has_one_holder_until_released_expired_or_taken,
    racing_lease_takers_one_wins,
    appends_renew_and_release_the_lease,
    delete_removes_the_lease,
    approval_events_land_only_when_their_condition_holds,
    an_append_with_a_refused_approval_writes_nothing,
    racing_deciders_one_wins,
    delete_removes_the_approvals,
    schedules_are_stored_with_an_append_and_listed_earliest_first,
    a_schedule_fires_once_with_its_turns_first_write,
    a_cancelled_schedule_never_fires,
    a_recurring_schedule_runs_each_occurrence_once_and_moves_on,
    a_deleted_recurring_schedule_fires_no_waiting_occurrence,
    delete_removes_the_schedules,
    origins_round_trip,
    instructions_round_trip_on_a_user_message_and_a_summary,
    an_approval_keeps_the_approvers_edited_arguments,
    only_an_approval_carries_edited_arguments,
)
