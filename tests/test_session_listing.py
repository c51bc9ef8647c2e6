"""Listing sessions by name and page, on SQLite: 10,000 sessions paged while others write.

The conformance suite (testing/conformance.py) checks the listing contract on
every store with a handful of sessions; this is the scale test the issue asks
for, plus `run(session_name=)` end to end.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import threading
import time
from pathlib import Path

from durable_agents import Agent, Message, run
from durable_agents.stores import _appends, _limits, _statements, sqlite_store
from durable_agents.stores.sqlite import SQLiteStore, _transaction
from durable_agents.testing import TestLLM

SESSIONS = 10_000
PAGE = 100


def _fill(store: SQLiteStore, base_ms: int) -> list[tuple[int, str]]:
    """SESSIONS sessions of 2 messages each, 1,000 per transaction, written with
    the statements of the store's own append (`_appends.append_statements`, as
    `append_messages_atomic` runs them) at chosen times: 7 sessions share each
    millisecond, so the id breaks ties. Returns their (created_at, id) keys."""
    keys = []
    with sqlite3.connect(store.path, isolation_level=None) as conn:
        conn.execute("PRAGMA busy_timeout = 10000")
        for start in range(0, SESSIONS, 1000):
            statements = []
            for n in range(start, start + 1000):
                session_id, at = f"old-{n * 7919 % SESSIONS:05d}", base_ms + n // 7
                messages = [Message.user(f"question {n}"), Message.assistant(f"answer {n}")]
                statements += _appends.append_statements(
                    session_id, 0, messages, at, agent_name="bulk", lease=None, approvals=(),
                    session_name=f"name-{n % 50}",
                )  # fmt: skip
                keys.append((at, session_id))

            def write(statements: list[_limits.Statement] = statements) -> None:
                for sql, params in statements:
                    conn.execute(sql, params)

            _transaction(conn, write)
    return keys


class _Writer(threading.Thread):
    """Keeps creating sessions (some back-dated into the listed range) and appending
    to old ones, through stores of its own on the same file, until stopped."""

    def __init__(self, path: Path, base_ms: int) -> None:
        super().__init__(daemon=True)
        self.path, self.base_ms = path, base_ms
        self.stop = threading.Event()
        self.warm = threading.Event()  # set after its first 20 appends (or on an error)
        self.created: list[str] = []
        self.appended = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._write())
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.warm.set()

    async def _write(self) -> None:
        back_ms = [self.base_ms + SESSIONS // 14]  # the middle of the old sessions' times
        now = sqlite_store(self.path)
        back = sqlite_store(self.path, clock=lambda: back_ms[0] / 1000)
        n = 0
        try:
            while not self.stop.is_set():
                store = back if n % 2 else now
                back_ms[0] += 1
                session_id = f"new-{n:05d}"
                await store.append_messages_atomic(session_id, 0, [Message.user("new")])
                self.created.append(session_id)
                old = f"old-{n * 13 % SESSIONS:05d}"
                await now.append_messages_atomic(old, 2 + n // SESSIONS, [Message.user("more")])
                self.appended += 1
                if self.appended == 20:
                    self.warm.set()
                n += 1
        finally:
            await now.close()
            await back.close()


async def test_ten_thousand_sessions_page_once_each_while_sessions_are_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "many.db"
    store = sqlite_store(path)
    await store.load_messages("create-the-schema")
    base_ms = int(time.time() * 1000) - 3_600_000
    began = time.perf_counter()
    keys = _fill(store, base_ms)
    fill_seconds = time.perf_counter() - began
    expected = [session_id for _, session_id in sorted(keys, reverse=True)]
    assert len(set(expected)) == SESSIONS

    writer = _Writer(path, base_ms)
    writer.start()
    assert await asyncio.to_thread(writer.warm.wait, 30)  # writing before paging begins
    before = set(writer.created)
    listed, page_seconds, cursor, pages = [], [], None, 0
    try:
        while True:
            began = time.perf_counter()
            page = await store.list_sessions(limit=PAGE, cursor=cursor)
            page_seconds.append(time.perf_counter() - began)
            assert len(page.sessions) <= PAGE
            listed += page.sessions
            pages += 1
            if page.next_cursor is None:
                break
            assert len(page.sessions) == PAGE
            cursor = page.next_cursor
            await asyncio.sleep(0.003)  # as a client between requests: the writer goes on
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    during = set(writer.created) - before
    assert writer.appended > 60, writer.appended
    assert during, "the writer created nothing while the pages were read"

    # Strictly in (created_at, id) descending order, so no session twice.
    order = [(i.created_at, i.id) for i in listed]
    assert order == sorted(order, reverse=True)
    assert len(set(order)) == len(order)
    # Every session that existed when paging began: exactly once, in order.
    old_listed = [i.id for i in listed if i.id.startswith("old-")]
    assert old_listed == expected
    assert before <= {i.id for i in listed}
    # Appends while paging changed counts, never places.
    assert max(i.message_count for i in listed) > 2
    assert {i.name for i in listed if i.id.startswith("old-")} == {f"name-{n}" for n in range(50)}

    # The page query walks the (created_at, id) index: no sort, no scan of the table.
    conn = sqlite3.connect(path)
    plan = " ".join(
        str(row[-1])
        for row in conn.execute(
            f"EXPLAIN QUERY PLAN {_statements.LIST_SESSIONS}", (1, "x", PAGE + 1)
        )
    )
    conn.close()
    assert "agent_sessions_by_creation" in plan, plan
    assert "TEMP B-TREE" not in plan, plan

    median_ms = statistics.median(page_seconds) * 1000
    print(
        f"\n{SESSIONS} sessions filled in {fill_seconds:.2f}s; {pages} pages of {PAGE} "
        f"while {len(during)} sessions were created and {writer.appended} appends landed: "
        f"median page {median_ms:.2f} ms, max {max(page_seconds) * 1000:.2f} ms"
    )
    assert median_ms < 50, f"a page took {median_ms:.1f} ms (median)"
    await store.close()


async def test_run_stores_the_session_name_and_usage_totals(tmp_path: Path) -> None:
    agent = Agent(name="namer", instructions="Answer.")
    async with sqlite_store(tmp_path / "a.db") as store:
        first = await run(
            agent, llm=TestLLM(), message="hi", session_id="id-1", store=store,
            session_name="support-ticket-7",
        )  # fmt: skip
        # A later turn with another name does not rename it; no name means the id.
        await run(
            agent, llm=TestLLM(), message="again", session_id="id-1", store=store,
            session_name="renamed",
        )  # fmt: skip
        await run(agent, llm=TestLLM(), message="hi", session_id="id-2", store=store)
        info = await store.get_session("id-1")
        assert info is not None
        assert info.name == "support-ticket-7"
        assert [i.id for i in await store.find_sessions("support-ticket-7")] == ["id-1"]
        assert await store.find_sessions("renamed") == []
        assert [i.id for i in await store.find_sessions("id-2")] == ["id-2"]
        stored = [m.usage for m in await store.load_messages("id-1") if m.usage]
        assert info.input_tokens == sum(u.input_tokens for u in stored) > 0
        assert info.output_tokens == sum(u.output_tokens for u in stored) > 0
        assert first.session_id == "id-1"
