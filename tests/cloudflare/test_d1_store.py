"""The D1 store on CPython, over the sqlite3-backed fake binding.

The same checks run against workerd's D1 in tests/runtime/test_d1_store.py;
passing both keeps `FakeD1Database` honest.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import d1_checks

from durable_agents.cloudflare import D1Store, d1_store
from durable_agents.errors import StoreError
from durable_agents.messages import Message
from durable_agents.stores import Store
from durable_agents.testing.fake_d1 import FakeD1Database


@pytest.fixture
def fake_db() -> Iterator[FakeD1Database]:
    db = FakeD1Database()
    yield db
    db.close()


@pytest.mark.parametrize("check", d1_checks.CHECKS, ids=lambda c: c.__name__)
async def test_d1_binding(fake_db: FakeD1Database, check: d1_checks.Check) -> None:
    await check(fake_db)


def test_is_a_durable_store(fake_db: FakeD1Database) -> None:
    store = d1_store(fake_db)
    assert isinstance(store, Store)
    assert isinstance(store, D1Store)
    assert store.durable is True


def test_imports_without_the_workers_runtime() -> None:
    code = (
        "import sys, durable_agents.cloudflare, durable_agents.testing.fake_d1; "
        "assert not {'js', 'pyodide', 'workers'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_file_backed_fake_keeps_data(tmp_path: Path) -> None:
    path = str(tmp_path / "d1.sqlite")
    first = FakeD1Database(path)
    store = d1_store(first)
    await store.create_tables()
    await store.append_messages_atomic("s", 0, [Message.user("kept")])
    first.close()
    second = FakeD1Database(path)
    assert await d1_store(second).load_messages("s") == [Message.user("kept")]
    second.close()


class _DroppingBatch:
    """A binding whose batch() dies like a dropped connection: after D1 may have committed."""

    def __init__(self, inner: FakeD1Database) -> None:
        self.inner = inner

    def prepare(self, sql: str) -> Any:
        return self.inner.prepare(sql)

    async def batch(self, statements: list[Any]) -> Any:
        raise ConnectionError("Network connection lost.")


async def test_a_failed_statement_says_nothing_was_written(fake_db: FakeD1Database) -> None:
    store = d1_store(fake_db)  # no tables: every statement fails with a D1_ERROR
    with pytest.raises(StoreError, match="nothing was written: D1_ERROR: no such table"):
        await store.append_messages_atomic("s", 0, [Message.user("hi")])


async def test_a_lost_connection_says_the_outcome_is_unknown(fake_db: FakeD1Database) -> None:
    store = d1_store(_DroppingBatch(fake_db))
    with pytest.raises(StoreError, match="may or may not have landed") as info:
        await store.append_messages_atomic("s", 0, [Message.user("hi")])
    assert info.value.session_id == "s"
