"""A D1 binding for CPython tests, over sqlite3, shaped like the one a Python Worker gets.

Use it to test code that takes `env.DB` (such as `d1_store`) without the
Workers runtime: `d1_store(FakeD1Database())`. For the real engine, run the
test inside the local runtime (tests/runtime/), which uses miniflare's D1.

It copies what the workers SDK hands Python code, and what D1 does:
- `prepare(sql).bind(*values)`; `await stmt.run()` / `.all()` give a dict with
  attribute access: `{"success", "meta": {"changes", "last_row_id", ...},
  "results": [row dicts]}`; `.first()` a row dict or None, `.first("col")` a
  value; `.raw()` a list of lists; `await db.batch([...])` a list of results.
- A batch is one transaction: a failing statement rolls the batch back whole.
  There is no other transaction control: `BEGIN`/`SAVEPOINT`/`COMMIT` are
  refused, as D1 refuses them.
- Errors raise `FakeD1Error` (the stand-in for `pyodide.ffi.JsException`)
  whose text reads like D1's: `D1_ERROR: UNIQUE constraint failed: t.a:
  SQLITE_CONSTRAINT`.
- D1's limits: 100 bound parameters per statement and 2,000,000 bytes per
  string or BLOB value. (Local miniflare does not enforce the second; D1 does.)
- An int beyond ±(2**53 - 2) is refused as workerd's D1 refuses it: a Python
  Worker hands it to D1 as a JavaScript BigInt (`D1_TYPE_ERROR`).
- Every call yields to the event loop before it runs, as a network round trip
  would, so `asyncio.gather` of two writers really interleaves between calls.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["D1Result", "FakeD1Database", "FakeD1Error", "FakeD1PreparedStatement"]

MAX_BOUND_PARAMETERS = 100
MAX_VALUE_BYTES = 2_000_000

_TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b", re.I)


class FakeD1Error(Exception):
    """A failed D1 call; on Workers the same failure raises `pyodide.ffi.JsException`."""


class D1Result(dict[str, Any]):
    """A dict whose keys also read as attributes, like the SDK's converted JS objects."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class FakeD1Database:
    """An in-memory (or file-backed) D1 database. See the module docstring."""

    def __init__(self, path: str = ":memory:") -> None:
        # Autocommit mode: D1 runs each statement in its own transaction and
        # a batch in one; this class issues the savepoints itself.
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._connection.execute("PRAGMA foreign_keys = ON")

    def prepare(self, sql: str) -> FakeD1PreparedStatement:
        return FakeD1PreparedStatement(self, sql, ())

    async def batch(self, statements: Iterable[FakeD1PreparedStatement]) -> list[D1Result]:
        statements = list(statements)
        await asyncio.sleep(0)
        self._connection.execute("SAVEPOINT fake_d1_batch")
        try:
            results = [self._run(s.sql, s.params, "all") for s in statements]
        except BaseException:
            self._connection.execute("ROLLBACK TO fake_d1_batch")
            raise
        finally:
            self._connection.execute("RELEASE fake_d1_batch")
        return results

    async def exec(self, sql: str) -> D1Result:
        """Run statements one per line, as D1's `exec` does (so a trigger body fails there too)."""
        await asyncio.sleep(0)
        lines = [line for line in sql.splitlines() if line.strip()]
        for number, line in enumerate(lines, start=1):
            try:
                self._execute(line, ())
            except FakeD1Error as exc:
                raise FakeD1Error(f"D1_EXEC_ERROR: Error in line {number}: {line}: {exc}") from None
        return D1Result(count=len(lines), duration=0)

    def close(self) -> None:
        self._connection.close()

    def _execute(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        if _TRANSACTION_CONTROL.match(sql):
            raise FakeD1Error(
                "D1_ERROR: To execute a transaction, please use the state.storage.transaction() "
                "or state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION or "
                "SAVEPOINT statements."
            )
        if len(params) > MAX_BOUND_PARAMETERS:
            raise FakeD1Error("D1_ERROR: too many SQL variables: SQLITE_ERROR")
        for value in params:
            if isinstance(value, str | bytes) and len(_as_bytes(value)) > MAX_VALUE_BYTES:
                raise FakeD1Error("D1_ERROR: string or blob too big: SQLITE_TOOBIG")
        try:
            return self._connection.execute(sql, tuple(params))
        except sqlite3.IntegrityError as exc:
            raise FakeD1Error(f"D1_ERROR: {exc}: SQLITE_CONSTRAINT") from None
        except sqlite3.Error as exc:
            raise FakeD1Error(f"D1_ERROR: {exc}: SQLITE_ERROR") from None

    def _run(self, sql: str, params: Sequence[Any], mode: str) -> Any:
        changes_before = self._connection.total_changes
        cursor = self._execute(sql, params)
        columns = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchall()
        if mode == "raw":
            return [list(row) for row in rows]
        written = self._connection.total_changes - changes_before
        return D1Result(
            success=True,
            meta=D1Result(
                served_by="fake-d1",
                duration=0,
                changes=cursor.rowcount if cursor.rowcount > 0 else 0,
                last_row_id=cursor.lastrowid or 0,
                changed_db=written > 0,
                rows_read=len(rows),
                rows_written=written,
            ),
            results=[D1Result(zip(columns, row, strict=True)) for row in rows],
        )


class FakeD1PreparedStatement:
    """A statement and its bound values; immutable, as in D1 (`bind` returns a new one)."""

    def __init__(self, database: FakeD1Database, sql: str, params: tuple[Any, ...]) -> None:
        self._database = database
        self.sql = sql
        self.params = params

    def bind(self, *values: Any) -> FakeD1PreparedStatement:
        for value in values:
            if value is not None and not isinstance(value, str | int | float | bytes):
                raise FakeD1Error(
                    f"D1_TYPE_ERROR: Type '{type(value).__name__}' not supported for value "
                    f"'{value!r}'"
                )
            # Pyodide hands an int to JS as a Number only if |n| < 2**53 - 1, else as a
            # BigInt, which D1 refuses (measured: tests/cloudflare/test_workerd_behaviour.py).
            if isinstance(value, int) and not -(2**53 - 1) < value < 2**53 - 1:
                raise FakeD1Error(f"D1_TYPE_ERROR: Type 'bigint' not supported for value '{value}'")
        return FakeD1PreparedStatement(self._database, self.sql, values)

    async def run(self) -> D1Result:
        await asyncio.sleep(0)
        result: D1Result = self._database._run(self.sql, self.params, "all")
        return result

    async def all(self) -> D1Result:
        return await self.run()

    async def raw(self) -> list[list[Any]]:
        await asyncio.sleep(0)
        rows: list[list[Any]] = self._database._run(self.sql, self.params, "raw")
        return rows

    async def first(self, column: str | None = None) -> Any:
        await asyncio.sleep(0)
        result: D1Result = self._database._run(self.sql, self.params, "all")
        if not result["results"]:
            return None
        row = result["results"][0]
        if column is None:
            return row
        if column not in row:
            raise FakeD1Error(f"D1_COLUMN_NOTFOUND: Column not found ({column})")
        return row[column]


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
