"""migrations/0001_init.sql is the one SQL source (`stores._sql.SCHEMA`) written out."""

from __future__ import annotations

from pathlib import Path

from durable_agents.stores import _sql

MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "0001_init.sql"


def test_migration_matches_the_schema() -> None:
    assert MIGRATION.read_text() == _sql.schema_script(), (
        "migrations/0001_init.sql differs from stores/_sql.py; regenerate it with "
        "python -c 'from durable_agents.stores import _sql; print(_sql.schema_script(), end=\"\")'"
        " > migrations/0001_init.sql (and add a new migration if 0001 was already applied)"
    )
