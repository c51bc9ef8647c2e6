"""Every integer a store binds stays within ±(2**53 - 2), on every CPython backend.

On Workers a Python int beyond that reaches D1 and Durable Object SQL as a JavaScript
BigInt, which both refuse (measured on workerd: tests/cloudflare/test_workerd_behaviour.py);
the fake D1 here refuses it the same way. So bounds the kit picks itself (the first
page's cursor, a huge limit, retention's cut-off, a lease's expiry) are clamped or
left out, and data beyond the range (a usage count) is refused by name, nothing
written, on every store alike: what one stores, any other can.
"""

from __future__ import annotations

import base64

import pytest

from durable_agents.errors import InvalidCursorError, SessionConflictError, StoreError
from durable_agents.messages import Message, Usage
from durable_agents.stores import Store, _limits, _paging, memory_store

LIMIT = 2**53 - 2


def test_the_limit_is_what_pyodide_hands_js_as_a_number() -> None:
    assert _limits.MAX_BOUND_INT == LIMIT == 9_007_199_254_740_990
    assert [_limits.clamp_int(v) for v in (2**60, -(2**60), 5)] == [LIMIT, -LIMIT, 5]


async def test_the_first_page_and_a_huge_limit_list(any_store: Store) -> None:
    for name in ("a", "b", "c"):
        await any_store.append_messages_atomic(name, 0, [Message.user(name)])
    first = await any_store.list_sessions(limit=1)
    assert [i.id for i in first.sessions] == ["c"]
    rest = await any_store.list_sessions(limit=2**60, cursor=first.next_cursor)
    assert ([i.id for i in rest.sessions], rest.next_cursor) == (["b", "a"], None)


async def test_bounds_beyond_the_range_pick_the_same_rows(any_store: Store) -> None:
    for name in ("a", "b"):
        await any_store.append_messages_atomic(name, 0, [Message.user(name)])
    assert await any_store.acquire_lease("a", "run", 2**60) is None  # held for good
    holder = await any_store.acquire_lease("a", "other", 1000)
    assert holder is not None
    assert holder.owner == "run"
    assert await any_store.delete_idle(-(2**60)) == 0
    assert await any_store.delete_idle(2**60, limit=2**60) == 2
    assert (await any_store.list_sessions()).sessions == []


async def test_a_usage_count_beyond_the_range_is_refused_by_name(any_store: Store) -> None:
    await any_store.append_messages_atomic("s", 0, [Message.user("q")])
    for usage, named in (
        (Usage(2**53 - 1, 0), "the input tokens of message 1 (assistant) is 9007199254740991"),
        (Usage(0, -(2**60)), "the output tokens of message 1 (assistant) is -1152921504606846976"),
    ):
        with pytest.raises(StoreError, match=r"nothing was written") as refused:
            await any_store.append_messages_atomic("s", 1, [Message.assistant("a", usage=usage)])
        assert named in str(refused.value)
        assert refused.value.session_id == "s"
    # Each within the range, but their sum in one append is not: refused as well.
    halves = [Message.assistant("a", usage=Usage(LIMIT // 2 + 1, 0)) for _ in range(2)]
    with pytest.raises(StoreError, match="the input tokens of one append is 9007199254740992"):
        await any_store.append_messages_atomic("s", 1, halves)
    assert await any_store.load_messages("s") == [Message.user("q")]
    ok = Message.assistant("a", usage=Usage(LIMIT, LIMIT))
    assert await any_store.append_messages_atomic("s", 1, [ok]) == 2
    info = await any_store.get_session("s")
    assert info is not None
    assert (info.input_tokens, info.output_tokens) == (LIMIT, LIMIT)


async def test_a_position_beyond_the_range_is_a_conflict(any_store: Store) -> None:
    with pytest.raises(SessionConflictError, match="no session holds more than"):
        await any_store.append_messages_atomic("s", LIMIT, [Message.user("far")])
    assert await any_store.get_session("s") is None


async def test_a_clock_beyond_the_range_is_refused() -> None:
    store = memory_store(clock=lambda: 2**53 / 1000)
    with pytest.raises(StoreError, match="the time of the append"):
        await store.append_messages_atomic("s", 0, [Message.user("q")])


async def test_a_cursor_beyond_the_range_is_not_one(any_store: Store) -> None:
    raw = f'[{2**53 - 1},"s"]'.encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    with pytest.raises(InvalidCursorError):
        await any_store.list_sessions(cursor=cursor)
    in_range = _paging.encode_cursor_keys(LIMIT, "s")
    assert (await any_store.list_sessions(cursor=in_range)).sessions == []
