"""migrations/ is the one SQL source (`stores._sql.MIGRATIONS`) written out, a file each."""

from __future__ import annotations

import hashlib
from pathlib import Path

from durable_agents.stores import _sql

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def test_each_migration_file_matches_its_statements() -> None:
    assert sorted(p.name for p in MIGRATIONS.glob("*.sql")) == [n for n, _ in _sql.MIGRATIONS]
    for name, statements in _sql.MIGRATIONS:
        assert (MIGRATIONS / name).read_text() == _sql.schema_script(statements), (
            f"migrations/{name} differs from stores/_sql.py MIGRATIONS; a migration that "
            "shipped is never edited: add the change as a new numbered migration"
        )


def test_the_first_migration_never_changes() -> None:
    # 0001 shipped; a deployed database applied it. Its text is frozen.
    text = (MIGRATIONS / "0001_init.sql").read_bytes()
    assert hashlib.sha256(text).hexdigest()[:16] == FIRST_MIGRATION_SHA256_PREFIX


FIRST_MIGRATION_SHA256_PREFIX = "32776a4f9a2fa942"
