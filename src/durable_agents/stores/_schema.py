"""The schema, read from the D1 migration files beside this module, `migrations/NNNN_*.sql`:
the one source. wrangler applies them to D1 (wrangler.toml's `migrations_dir`); the SQLite
store on open, `D1Store.create_tables` and the Durable Object store on first use apply
the same files' statements here (`schema_plan`). They are package data: a wheel ships them,
and scripts/build_worker.py stages them beside the Worker's modules (read with
`_resources.read_text`, in the Worker as on CPython). Guide: docs/contract.md; applying
them to D1: docs/deploy.md.

A migration file is its statements, each ended by `;` and a blank line (no comments),
applied in the order of the file names. Append a new numbered file; never edit one that
shipped (a deployed database applied it). Every statement but a migration's
`ALTER TABLE ... ADD COLUMN` and its backfill `UPDATE` is idempotent (`IF NOT EXISTS`);
`schema_plan` leaves those out for a database that has the column already.

Why the schema itself guards the history: rows are insert-only and keyed by
(session_id, seq). The UNIQUE key makes a writer that lost a race collide; the
in-order trigger makes a writer whose view is stale the other way (the session was
deleted or shortened under it) fail too, so an append at `expected_seq` lands only if
exactly `expected_seq` rows precede it: a compare-and-swap made of constraints, which
is all a D1 batch (no BEGIN, no reads inside) can offer. The partial unique indexes are
the last line of defence for "one result per tool call" and "one turn per request key".
What each later file adds, and why:
- 0002 leases: one row per session while a run holds it; a table of its own, since a
  lease is not history and taking one must not create a session.
- 0003 approvals: an insert-only log per call that needs a person's yes. A decision or
  a claim takes its tool_name from the row it depends on through a scalar subquery
  (`_statements.DEPENDENT_APPROVAL`), so when that row is missing NOT NULL fails the
  write, batch and all; the unique keys let one decision and one claim per call land.
- 0004 session names and usage totals, kept by the append itself (never a SUM), with
  the indexes listing pages by the immutable (created_at, id) and finding by name.
- 0005 summaries: the partial index finds the latest summary without reading the history.
- 0006 schedules: the trigger lets a scheduled turn's user message land only while its
  schedule is stored, so a cancelled or fired schedule never runs (again).
- 0007 instructions and edited approvals: only an approval may carry edited arguments
  (the CHECK), with their own digest.
- 0008 recurring schedules: a schedule's `rule`; the trigger of 0006 makes way for one
  that also takes a recurring schedule's occurrence (`schedule:<id>@<due ms>`), only
  while the row is due at that time, so each occurrence runs once. (A dropped object is
  made again by its file and dropped again by the later one on every plan: idempotent.)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from .._resources import file_names, read_text
from ..errors import StoreError

_PACKAGE = __name__.rpartition(".")[0]
FOLDER = "migrations"

_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")
_CREATED = re.compile(r"CREATE (?:UNIQUE )?(?:TABLE|INDEX|TRIGGER) IF NOT EXISTS (\w+)")
_DROPPED = re.compile(r"DROP (?:TABLE|INDEX|TRIGGER) IF EXISTS (\w+)")


class Migration(NamedTuple):
    """One file of `migrations/`: its name and its statements, in order."""

    name: str
    statements: tuple[str, ...]


def split_statements(text: str) -> tuple[str, ...]:
    """The statements of a migration file's text (see the module docstring for its form).
    A trigger's body holds `;` too, never followed by a blank line."""
    body = text.strip()
    if not body:
        return ()
    if not body.endswith(";"):
        raise ValueError("a migration file ends with a statement's `;`")
    return tuple(statement.strip() for statement in body[:-1].split(";\n\n"))


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration file of the package, in order (read once per process)."""
    where = f"{_PACKAGE}'s {FOLDER}/"
    try:
        found = tuple(
            Migration(name, split_statements(read_text(_PACKAGE, f"{FOLDER}/{name}")))
            for name in file_names(_PACKAGE, FOLDER, ".sql")
        )
    except (OSError, ValueError) as exc:
        raise StoreError(f"the schema's migration files ({where}) cannot be read: {exc}") from exc
    if not found:
        raise StoreError(
            f"no migration files in {where}: the package data is missing (a Worker bundle "
            "stages it with scripts/build_worker.py)"
        )
    return found


def schema() -> tuple[str, ...]:
    """Every statement of every migration, in order."""
    return tuple(statement for migration in migrations() for statement in migration.statements)


def schema_script(statements: Sequence[str] | None = None) -> str:
    """Statements (the whole schema by default) as one SQL script, as a migration file
    holds them."""
    chosen = schema() if statements is None else statements
    return "".join(f"{statement};\n\n" for statement in chosen).rstrip() + "\n"


def schema_plan(columns: Mapping[str, Collection[str]]) -> list[str]:
    """The statements that bring a database to the schema, given the columns its
    tables have now (`{table: columns}`, a missing table absent or empty).

    The idempotent statements always run; a migration that adds columns runs
    its ALTERs and its backfill only if its first added column is missing
    (a migration lands whole: either the database has all of it or none).
    Run the plan in one transaction, so two processes opening an old file
    cannot both add the column.
    """
    plan: list[str] = []
    for migration in migrations():
        added = [m for s in migration.statements if (m := _ADD_COLUMN.match(s))]
        applied = bool(added) and added[0][2] in columns.get(added[0][1], ())
        for statement in migration.statements:
            one_off = _ADD_COLUMN.match(statement) or statement.startswith("UPDATE ")
            if not (applied and one_off):
                plan.append(statement)
    return plan


def altered_tables() -> tuple[str, ...]:
    """The tables migrations add columns to, in the order they first do."""
    tables = (m[1] for s in schema() if (m := _ADD_COLUMN.match(s)))
    return tuple(dict.fromkeys(tables))


def is_current(existing: Collection[str], columns: Mapping[str, Collection[str]]) -> bool:
    """Whether a database has every table, index and trigger the schema creates
    (`existing`: their names) and every column it adds (`columns`, as `schema_plan`'s)."""
    added = {(m[1], m[2]) for s in schema() if (m := _ADD_COLUMN.match(s))}
    return set(schema_objects()) <= set(existing) and all(c in columns.get(t, ()) for t, c in added)


def schema_objects() -> tuple[str, ...]:
    """The names of the tables, indexes and triggers the schema ends with: each one a
    migration creates, unless a later one drops it."""
    names: dict[str, None] = {}
    for statement in schema():
        if created := _CREATED.match(statement):
            names[created[1]] = None
        elif dropped := _DROPPED.match(statement):
            names.pop(dropped[1], None)
    return tuple(names)


def table_info(table: str) -> str:
    """The statement listing a table's columns: rows (cid, name, type, notnull,
    dflt_value, pk); none for a missing table."""
    return f"PRAGMA table_info({table})"
