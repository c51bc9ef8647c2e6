"""The one schema (`migrations/*.sql`) and the shared statements (`_statements`), as
PostgreSQL runs them: each dialect difference is translated here, where it occurs,
so PostgreSQL has no second copy of the schema. Guide: docs/running-at-scale.md.

The differences, and why each translation keeps SQLite's meaning:
- Placeholders: `?` becomes psycopg's `%s` (no statement holds a `%` or a `?` in a
  literal; `statement` refuses one that does).
- Types: SQLite's INTEGER is 64-bit, PostgreSQL's 32-bit: it becomes BIGINT. TEXT
  compares by code point in SQLite (UTF-8 bytes): it becomes TEXT COLLATE "C", so
  listing pages and cursors order ids as every other store does, whatever the
  database's locale.
- rowid: a SQLite table has one, in insertion order (`ORDER BY rowid` lists approval
  events as written); a PostgreSQL table gets it as an identity column.
- Triggers: SQLite's `BEFORE INSERT ... WHEN cond BEGIN SELECT RAISE(ABORT, msg); END`
  becomes a plpgsql function that raises the same message (an integrity violation,
  as RAISE(ABORT) is) and a trigger running it: PostgreSQL allows no subquery in a
  trigger's WHEN, which keeps the condition's part before its subquery. SQLite's
  `DROP TRIGGER IF EXISTS name` names no table, which PostgreSQL's needs: it drops the
  trigger from whichever table has it, and its function.
- NUL: PostgreSQL text cannot hold U+0000, which the kit stores like any character.
  Every bound text carries U+0000 as U+0001 U+0001 and U+0001 as U+0001 U+0002 (the
  code `_appends` uses for packed rows), and every text read back is decoded. The code
  is prefix-free and keeps code point order, so equality, uniqueness and ORDER BY
  are those of the decoded texts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ._appends import _packable

_TRIGGER = re.compile(
    r"CREATE TRIGGER IF NOT EXISTS (?P<name>\w+)\s+BEFORE INSERT ON (?P<table>\w+)\s+"
    r"WHEN (?P<condition>.*?)\s+BEGIN\s+SELECT RAISE\(ABORT, '(?P<message>[^'%]*)'\);\s+END",
    re.DOTALL,
)
_DROP_TRIGGER = re.compile(r"DROP TRIGGER IF EXISTS (?P<name>\w+)")
_CREATE_TABLE = re.compile(r"(CREATE TABLE IF NOT EXISTS \w+ \()")
_INTEGER = re.compile(r"\bINTEGER\b")
_TEXT = re.compile(r"\bTEXT\b")

# The columns of the current schema's tables, (table_name, column_name) rows: what
# `_schema.schema_plan` needs to know which migrations have run (SQLite: PRAGMA table_info).
SELECT_COLUMNS = (
    "SELECT table_name, column_name FROM information_schema.columns "
    "WHERE table_schema = current_schema()"
)
# The names of the current schema's tables, indexes and triggers: with the columns, what
# `_schema.is_current` needs to know that no migration is due.
SELECT_OBJECTS = (
    "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
    "UNION ALL SELECT t.tgname FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid "
    "WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal"
)


def statement(sql: str) -> str:
    """A shared statement with psycopg's placeholders."""
    if "%" in sql or "'?" in sql or "?'" in sql:
        raise ValueError(f"a statement to translate has a % or a quoted ?: {sql[:60]!r}")
    return sql.replace("?", "%s")


def schema_statements(statements: Iterable[str]) -> list[str]:
    """Migration statements (as `_schema.schema_plan` gives them) in PostgreSQL's dialect."""
    translated: list[str] = []
    for sql in statements:
        trigger = _TRIGGER.fullmatch(sql)
        if trigger is not None:
            translated += _trigger(**trigger.groupdict())
            continue
        dropped = _DROP_TRIGGER.fullmatch(sql)
        if dropped is not None:
            translated += _drop_trigger(dropped["name"])
            continue
        if sql.startswith(("CREATE TABLE", "ALTER TABLE")):
            sql = _TEXT.sub('TEXT COLLATE "C"', _INTEGER.sub("BIGINT", sql))
            sql = _CREATE_TABLE.sub(r"\1\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY,", sql)
        translated.append(sql)
    return translated


def _trigger(name: str, table: str, condition: str, message: str) -> list[str]:
    # The condition's part before its subquery also goes in the trigger's WHEN, which
    # PostgreSQL checks without calling the function: a row it rules out (a message
    # that no schedule fires) costs no call. The function still checks it all.
    guard, _, _ = condition.partition(" AND NOT EXISTS (")
    when = f" WHEN ({guard})" if guard != condition and "SELECT" not in guard else ""
    return [
        f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $body$\n"
        f"BEGIN\n    IF {condition} THEN\n"
        f"        RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation';\n"
        "    END IF;\n    RETURN NEW;\nEND\n$body$",
        f"CREATE OR REPLACE TRIGGER {name} BEFORE INSERT ON {table} "
        f"FOR EACH ROW{when} EXECUTE FUNCTION {name}()",
    ]


def _drop_trigger(name: str) -> list[str]:
    return [
        "DO $body$\nDECLARE found_table text;\nBEGIN\n"
        "    SELECT event_object_table INTO found_table FROM information_schema.triggers\n"
        f"    WHERE trigger_name = '{name}' AND trigger_schema = current_schema() LIMIT 1;\n"
        "    IF found_table IS NOT NULL THEN\n"
        f"        EXECUTE format('DROP TRIGGER {name} ON %I', found_table);\n"
        "    END IF;\nEND\n$body$",
        f"DROP FUNCTION IF EXISTS {name}()",
    ]


def encode_params(params: Sequence[Any]) -> tuple[Any, ...]:
    """Parameters with every text as PostgreSQL can hold it (see the module docstring):
    the code a packed row's texts travel in (`_appends._packable`)."""
    return tuple(map(_packable, params))


def decode_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """A row read back, every text decoded (see `encode_params`)."""
    return tuple(
        value.replace("\x01\x01", "\x00").replace("\x01\x02", "\x01")
        if isinstance(value, str) and "\x01" in value
        else value
        for value in row
    )
