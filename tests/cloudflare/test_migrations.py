"""The migration files are the schema's one source: the folder wrangler applies to D1
(wrangler.toml's `migrations_dir`) is the one the stores read (`stores/_schema.py`), and
every store's schema is exactly what applying those files makes."""

from __future__ import annotations

import hashlib
import sqlite3
import tomllib
from pathlib import Path

import pytest
from tests.support.do_storage import FakeDurableObjectStorage

from durable_agents.cloudflare import d1_store, durable_object_store
from durable_agents.stores import _schema, sqlite_store
from durable_agents.testing.fake_d1 import FakeD1Database

PROJECT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((PROJECT / "wrangler.toml").read_text())
MIGRATIONS = PROJECT / CONFIG["d1_databases"][0]["migrations_dir"]
STORES_MIGRATIONS = PROJECT / "src" / "durable_agents" / "stores" / _schema.FOLDER


def test_wrangler_applies_the_folder_the_stores_read() -> None:
    assert MIGRATIONS.resolve() == STORES_MIGRATIONS.resolve()
    names = sorted(p.name for p in MIGRATIONS.glob("*.sql"))
    assert names[0] == "0001_init.sql"
    assert [m.name for m in _schema.migrations()] == names


def test_each_migration_file_is_its_statements_and_nothing_else() -> None:
    # What the stores split a file into is the whole file: a statement the split
    # lost or merged would make a store's schema differ from D1's.
    for name, statements in _schema.migrations():
        assert statements, name
        assert (MIGRATIONS / name).read_text() == _schema.schema_script(statements), (
            f"{name} is not in the form the stores read (stores/_schema.py): each statement "
            "ends with `;` and a blank line, no comments"
        )
        for statement in statements:
            assert sqlite3.complete_statement(statement + ";"), (name, statement)


def _schema_rows(connection: sqlite3.Connection) -> list[tuple[str, str, str, str | None]]:
    return connection.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name LIKE 'agent_%' "
        "ORDER BY type, name"
    ).fetchall()


def _applied_as_wrangler_does(path: Path) -> list[tuple[str, str, str, str | None]]:
    """The schema of a database the migration files were run on, whole, in order."""
    connection = sqlite3.connect(path)
    try:
        for file in sorted(MIGRATIONS.glob("*.sql")):
            connection.executescript(file.read_text())
        return _schema_rows(connection)
    finally:
        connection.close()


@pytest.mark.parametrize("backend", ["sqlite", "d1-fake", "durable-object"])
async def test_a_fresh_stores_schema_is_exactly_the_migrations(
    backend: str, tmp_path: Path
) -> None:
    wanted = _applied_as_wrangler_does(tmp_path / "wrangler.db")
    assert {"agent_sessions", "agent_messages_append_only_in_order"} <= {r[1] for r in wanted}
    if backend == "sqlite":
        store = sqlite_store(tmp_path / "store.db")
        await store.list_sessions()  # opened: the schema applied
        await store.close()
        connection = sqlite3.connect(tmp_path / "store.db")
    elif backend == "d1-fake":
        database = FakeD1Database(str(tmp_path / "d1.db"))
        await d1_store(database).create_tables()
        database.close()
        connection = sqlite3.connect(tmp_path / "d1.db")
    else:
        storage = FakeDurableObjectStorage()
        await durable_object_store(storage).list_sessions()  # first use: the schema applied
        connection = storage.connection
    try:
        assert _schema_rows(connection) == wanted
    finally:
        connection.close()


def test_the_first_migration_never_changes() -> None:
    # 0001 shipped; a deployed database applied it. Its text is frozen.
    text = (MIGRATIONS / "0001_init.sql").read_bytes()
    assert hashlib.sha256(text).hexdigest()[:16] == FIRST_MIGRATION_SHA256_PREFIX


FIRST_MIGRATION_SHA256_PREFIX = "32776a4f9a2fa942"
