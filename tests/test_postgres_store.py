"""What is specific to the PostgreSQL store, on a real server (tests/support/postgres_server.py):
the crash sweep and `check_agent` over it, writers on separate connections racing for one
session (what two hosts do), and the command line with a postgresql:// URL. The shared
contract: tests/test_store_conformance.py; several worker processes: test_postgres_processes.py.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.support.crash_sweep import sweep
from tests.support.postgres_server import (
    Server,
    postgres_fixture,  # noqa: F401 - fixture
)

from durable_agents import Message, SessionConflictError
from durable_agents.stores import Schedule, _postgres_sql, _schema
from durable_agents.stores.postgres import PostgresStore, postgres_store
from durable_agents.testing import check_agent
from durable_agents.testing.conformance import ticking_clock


@pytest.fixture(name="dsn")
def dsn_fixture(postgres: Server) -> str:
    return postgres.fresh_dsn()


@pytest.fixture(name="hosts")
async def hosts_fixture(dsn: str) -> AsyncIterator[list[PostgresStore]]:
    """Four stores on one database, each with its own pool: four hosts."""
    stores = [postgres_store(dsn, max_connections=4) for _ in range(4)]
    yield stores
    for store in stores:
        await store.close()


async def test_every_crash_point_keeps_tools_at_most_once(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with postgres_store(dsn, clock=ticking_clock()) as store:
        report = await sweep(store)
    with capsys.disabled():
        print(f"\n  crash sweep on PostgresStore: {report}")
    assert report.scenarios == 2 * (report.baseline_appends + report.baseline_handler_calls)


def test_check_agent_passes_on_the_example_over_postgres(postgres: Server) -> None:
    report = check_agent(
        importlib.import_module("examples.triage.agent"),
        store=lambda _: postgres_store(postgres.fresh_dsn()),
    )
    assert report.crash_points == (3 * 2 + 5 * 2) * 2  # as on SQLite (tests/test_check_agent.py)
    assert report.unkeyed_unsafe_requests == ()


async def test_one_append_per_position_wins_across_hosts(hosts: list[PostgresStore]) -> None:
    await hosts[0].append_messages_atomic("s", 0, [Message.user("hi")])
    for seq in range(1, 6):
        tries = [
            store.append_messages_atomic("s", seq, [Message.assistant(f"{seq} from {i}")])
            for i, store in enumerate(hosts * 2)
        ]
        outcomes = await asyncio.gather(*tries, return_exceptions=True)
        won = [o for o in outcomes if not isinstance(o, BaseException)]
        assert won == [seq + 1], outcomes
        assert all(isinstance(o, SessionConflictError) for o in outcomes if o not in won)
    assert len(await hosts[1].load_messages("s")) == 6


async def test_an_append_racing_a_delete_never_lands_stranded(hosts: list[PostgresStore]) -> None:
    for round_ in range(20):
        session = f"r{round_}"
        await hosts[0].append_messages_atomic(session, 0, [Message.user("a"), Message.user("b")])
        await asyncio.gather(
            hosts[1].append_messages_atomic(session, 2, [Message.assistant("c")]),
            hosts[2].delete_session(session),
            return_exceptions=True,
        )
        left = await hosts[3].load_messages(session)
        # Either the delete came last (nothing left) or first (then the append conflicts):
        # never a message at position 2 with nothing before it.
        assert left in ([], [Message.user("a"), Message.user("b"), Message.assistant("c")]), left
        info = await hosts[3].get_session(session)
        assert (info is None) == (left == [])


async def test_an_append_racing_retention_keeps_the_session_whole_or_deletes_it(
    dsn: str, hosts: list[PostgresStore]
) -> None:
    async with postgres_store(dsn, clock=lambda: 1_000.0) as long_ago:
        for round_ in range(10):
            await long_ago.append_messages_atomic(f"o{round_}", 0, [Message.user("a")])
    for round_ in range(10):
        session = f"o{round_}"
        await asyncio.gather(
            hosts[1].append_messages_atomic(session, 1, [Message.assistant("b")]),
            hosts[2].delete_idle(2_000_000, limit=1),  # idle since 1,000 s: this one
            return_exceptions=True,
        )
        left = await hosts[3].load_messages(session)
        assert left in ([], [Message.user("a"), Message.assistant("b")]), left


async def test_one_host_takes_a_free_lease(hosts: list[PostgresStore]) -> None:
    for round_ in range(10):
        tries = [s.acquire_lease(f"l{round_}", f"host{i}", 60_000) for i, s in enumerate(hosts)]
        holders = await asyncio.gather(*tries)
        assert holders.count(None) == 1, holders
        winner = f"host{holders.index(None)}"
        assert {h.owner for h in holders if h is not None} == {winner}


async def test_a_schedule_is_fired_or_cancelled_never_both(hosts: list[PostgresStore]) -> None:
    for round_ in range(10):
        session, plan = f"s{round_}", Schedule(f"x{round_}", "later", 1_000, 0)
        await hosts[0].append_messages_atomic(session, 0, [Message.user("hi")], schedules=[plan])
        fired = Message("user", "later", request_key=plan.request_key, origin="scheduled")
        fire, cancel = await asyncio.gather(
            hosts[1].append_messages_atomic(session, 1, [fired]),
            hosts[2].delete_schedule(session, plan.schedule_id),
            return_exceptions=True,
        )
        landed = not isinstance(fire, BaseException)
        assert landed != (cancel is True), (fire, cancel)
        assert await hosts[3].load_schedules(session) == []


def test_a_store_serves_one_event_loop_after_another(dsn: str) -> None:
    """Each `asyncio.run` ends with the store open (a program that never closes it): the
    loop ends at once, with no task of the store's left to wait for."""
    store = postgres_store(dsn)
    asyncio.run(store.append_messages_atomic("s", 0, [Message.user("hi")]))
    asyncio.run(store.append_messages_atomic("s", 1, [Message.assistant("hello")]))
    for _ in range(20):
        assert len(asyncio.run(store.load_messages("s"))) == 2
    asyncio.run(store.close())


async def test_hosts_opening_a_fresh_database_at_once_migrate_it_once(
    hosts: list[PostgresStore],
) -> None:
    found = await asyncio.gather(*(store.get_session("none") for store in hosts))
    assert found == [None] * len(hosts)


async def test_an_older_schema_is_migrated_on_first_use(dsn: str) -> None:
    """A database at migration 0003 (no names, usage totals, summaries, schedules): the
    store adds what is missing and backfills the names and totals, as on SQLite."""
    import psycopg

    old = [s for m in _schema.migrations()[:3] for s in m.statements]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in _postgres_sql.schema_statements(old):
            await conn.execute(statement)
        await conn.execute(
            "INSERT INTO agent_sessions (id, agent_name, state, message_count, created_at, "
            "updated_at) VALUES ('old', 'bot', 'idle', 1, 5, 5)"
        )
        await conn.execute(
            "INSERT INTO agent_messages (session_id, seq, role, content, input_tokens, "
            "output_tokens, created_at) VALUES ('old', 0, 'assistant', 'hi', 3, 4, 5)"
        )
    async with postgres_store(dsn) as store:
        info = await store.get_session("old")
        assert info is not None
        assert (info.name, info.input_tokens, info.output_tokens) == ("old", 3, 4)
        assert await store.append_messages_atomic("old", 1, [Message.user("again")]) == 2
        assert [m.content for m in await store.load_messages("old")] == ["hi", "again"]


_WRITE_FUNCTIONS = (
    "SELECT proname FROM pg_proc WHERE proname LIKE 'agent!_write!_%' ESCAPE '!' "
    "AND pronamespace = current_schema()::regnamespace"
)


async def write_functions(dsn: str) -> list[str]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return [row[0] for row in await (await conn.execute(_WRITE_FUNCTIONS)).fetchall()]


async def test_a_write_is_a_call_of_a_function_made_from_its_statements(dsn: str) -> None:
    """One function per shape of write, whoever makes it first; an append binding more
    than a function takes (seven messages) goes as one query, with the same outcome."""
    async with postgres_store(dsn) as one, postgres_store(dsn) as other:
        await one.append_messages_atomic("a", 0, [Message.user("hi\x00there")])
        await other.append_messages_atomic("b", 0, [Message.user("hi")])
        assert len(await write_functions(dsn)) == 1
        seven = [Message.assistant(f"{n}") for n in range(7)]
        assert await one.append_messages_atomic("a", 1, seven) == 8
        assert len(await write_functions(dsn)) == 1
        for late in (7, 9):  # a position taken; one past the end (the in-order trigger)
            with pytest.raises(SessionConflictError) as raised:
                await other.append_messages_atomic("a", late, [Message.user("late")])
            assert "agent_write_" not in str(raised.value)  # the server's words, no CONTEXT
        loaded = await other.load_messages("a")
    assert [m.content for m in loaded] == ["hi\x00there", *(f"{n}" for n in range(7))]


async def test_a_write_function_dropped_under_a_running_store_is_made_again(dsn: str) -> None:
    import psycopg

    async with postgres_store(dsn) as store:
        await store.append_messages_atomic("s", 0, [Message.user("hi")])
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for name in await write_functions(dsn):
                await conn.execute(f"DROP FUNCTION {name}")
        assert await store.append_messages_atomic("s", 1, [Message.user("again")]) == 2
        assert len(await store.load_messages("s")) == 2
    assert len(await write_functions(dsn)) == 1


async def test_a_role_that_may_not_make_functions_still_writes(dsn: str) -> None:
    """A role with the tables' rights but no CREATE on the schema, its tables made by
    another (as a migration role does in production): it opens the current database
    without running the migration's DDL, calls the write function another role made,
    and sends a write of a shape with none as one query."""
    import psycopg

    async with postgres_store(dsn) as owner:
        await owner.append_messages_atomic("o", 0, [Message.user("hi")])  # its function
    made = await write_functions(dsn)
    schema = dsn.rsplit("search_path%3D", 1)[1]
    role = f"writer_{schema}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE ROLE {role} LOGIN")
        await conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        await conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}")
        await conn.execute(f"ALTER ROLE {role} SET track_functions = 'pl'")  # counts calls
    as_role = dsn.replace("postgresql://postgres@", f"postgresql://{role}@")
    async with postgres_store(as_role) as store:
        assert await store.append_messages_atomic("s", 0, [Message.user("hi")]) == 1
        two = [Message.assistant("one"), Message.assistant("two")]  # a shape with none
        assert await store.append_messages_atomic("s", 1, two) == 3
        assert len(await store.load_messages("s")) == 3
    assert await write_functions(dsn) == made  # none made by the role
    # The role's calls of the function: the first append's (the second went as a query),
    # counted once its connections' backends have ended (they report as they exit).
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(200):
            found = await conn.execute(
                "SELECT calls FROM pg_stat_user_functions WHERE funcname = %s", (made[0],)
            )
            calls = await found.fetchall()
            if calls:
                break
            await asyncio.sleep(0.05)
    assert calls == [(1,)]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def test_the_command_lists_and_shows_sessions_by_url(dsn: str) -> None:
    async with postgres_store(dsn) as store:
        await store.append_messages_atomic(
            "s1", 0, [Message.user("hi\x00there"), Message.assistant("ok")], session_name="ops"
        )
    listed = cli("sessions", "list", "--db", dsn, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [s["name"] for s in json.loads(listed.stdout)["sessions"]] == ["ops"]
    shown = cli("sessions", "show", "ops", "--db", dsn, "--json")
    assert shown.returncode == 0, shown.stderr
    assert "hi\\u0000there" in shown.stdout


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    done = cli("sessions", "list", "--db", f"postgresql://postgres@/postgres?host={tmp_path}")
    assert done.returncode == 2
    assert "PostgreSQL store failed" in done.stderr
    assert "Traceback" not in done.stderr
