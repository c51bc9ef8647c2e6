"""The PostgreSQL store's writes as server-side functions: one per write shape (its
sequence of statements), made from the shared statements themselves, so a step's write
is one prepared call (one round trip, its plans kept by the server) instead of several
statements the server parses and plans each time. Guide: docs/running-at-scale.md.

How a shape becomes a function:
- The types of each statement's parameters are PostgreSQL's own: the statement is
  prepared once (`PREPARE`) and the server says what each `$n` is (a column's type, a
  comparison's). No second copy of the schema's types lives here.
- Every `?` becomes one of the function's arguments, `$1`, `$2`, ... in order, typed
  as the server said; the call casts each value to it. (Passing them as arrays instead
  measured slower: psycopg writes an array's text in Python, escaping each element.)
- The function runs the statements in order, each with its own snapshot (READ
  COMMITTED, as the statements of one simple query do), a `SELECT` as `PERFORM`, and
  returns each statement's row count. Its name is a hash of its text: a changed
  statement is a new function, and two processes making the same one agree.

A shape keeps the simple-query path (`PostgresStore._write`: the statements as one
query, values bound client-side) where a statement's parameters are not all text or
bigint (none of the store's, today), where it binds more than a function takes
(MAX_ARGUMENTS: an append of 7 messages or more), or where the role may not create
functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["MAX_ARGUMENTS", "WriteFunctions"]

# A function takes at most 100 arguments (FUNC_MAX_ARGS): a shape binding more (an
# append of 7 messages or more) keeps the simple-query path.
MAX_ARGUMENTS = 100
_KINDS: dict[str, type] = {"text": str, "bigint": int}
# Serialises the making of functions in a database: two processes making the same one
# at once would otherwise race on the catalog. (The migration's lock is another.)
_LOCK_FUNCTIONS = "SELECT pg_advisory_xact_lock(-4871002538)"
_EXISTS = (
    "SELECT 1 FROM pg_proc WHERE proname = %s AND pronamespace = current_schema()::regnamespace"
)
_PROBE = "agent_write_probe"


class WriteFunctions:
    """The write functions of one database (one store): made on first use of a shape,
    remembered by shape as the query calling it; the parameter types of each
    statement, by its text."""

    def __init__(self) -> None:
        self._types: dict[str, tuple[str, ...] | None] = {}
        self._calls: dict[tuple[str, ...], _Call | None] = {}

    def known(self, sqls: tuple[str, ...]) -> _Call | None:
        """The call of a shape's function already made (None: not yet, or never)."""
        return self._calls.get(sqls)

    def unusable(self, sqls: tuple[str, ...], params: Sequence[Any]) -> bool:
        """Whether the shape has no function (see the module docstring)."""
        return len(params) > MAX_ARGUMENTS or (sqls in self._calls and self._calls[sqls] is None)

    def forget(self, sqls: tuple[str, ...]) -> None:
        """The function was not found (dropped since): make it again on next use."""
        self._calls.pop(sqls, None)

    async def make(self, conn: psycopg.AsyncConnection[Any], sqls: tuple[str, ...]) -> _Call | None:
        """The call of the function running `sqls` (psycopg placeholders), made if
        missing; None when a statement's parameters are not all text or bigint, or
        are more than a function takes."""
        types = [await self._statement_types(conn, sql) for sql in sqls]
        kinds = tuple(kind for found in types for kind in found or ())
        if any(found is None for found in types) or len(kinds) > MAX_ARGUMENTS:
            self._calls[sqls] = None
            return None
        name, definition = _function(sqls, kinds)
        import psycopg

        try:
            async with conn.transaction():
                await conn.execute(_LOCK_FUNCTIONS)
                if not await (await conn.execute(_EXISTS, (name,))).fetchall():
                    await conn.execute(definition)
        except psycopg.errors.InsufficientPrivilege:  # a role that may not make one
            self._calls[sqls] = None
            return None
        placeholders = ", ".join(f"%s::{kind}" for kind in kinds)
        call = _Call(f"SELECT {name}({placeholders})", kinds)
        self._calls[sqls] = call
        return call

    async def _statement_types(
        self, conn: psycopg.AsyncConnection[Any], sql: str
    ) -> tuple[str, ...] | None:
        if sql in self._types:
            return self._types[sql]
        import psycopg

        found: tuple[str, ...] | None = None
        try:
            async with conn.transaction():  # the probe lives and dies in it
                await conn.execute(f"PREPARE {_PROBE} AS {_numbered(sql)}")
                cursor = await conn.execute(
                    "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = %s",
                    (_PROBE,),
                )
                row = await cursor.fetchone()
                await conn.execute(f"DEALLOCATE {_PROBE}")
            kinds = tuple(row[0]) if row else ()
            if all(kind in _KINDS for kind in kinds):
                found = kinds
        except psycopg.ProgrammingError:  # a type the server cannot tell: not a function
            found = None
        self._types[sql] = found
        return found


class _Call:
    """The query calling one write function, and the type of each of its values."""

    __slots__ = ("kinds", "sql")

    def __init__(self, sql: str, kinds: tuple[str, ...]) -> None:
        self.sql = sql
        self.kinds = kinds

    def accepts(self, params: Sequence[Any]) -> bool:
        """Whether each value is of its placeholder's type (else the caller runs the
        statements as they are: the server then says what is wrong)."""
        if len(params) != len(self.kinds):
            return False
        for kind, value in zip(self.kinds, params, strict=True):
            if value is not None and type(value) is not _KINDS[kind]:
                return False
        return True


def _numbered(sql: str, first: int = 1) -> str:
    """`%s` placeholders as $first, $first + 1, ... (what PREPARE and a function take)."""
    parts = sql.split("%s")
    numbered = [f"{part}${first + i}" for i, part in enumerate(parts[:-1])]
    return "".join(numbered) + parts[-1]


def _function(sqls: Sequence[str], kinds: Sequence[str]) -> tuple[str, str]:
    """(name, CREATE FUNCTION statement) of the function running `sqls` in order, their
    placeholders its arguments in order, of types `kinds`."""
    body: list[str] = []
    first = 1
    for sql in sqls:
        text = _numbered(sql, first)
        first += sql.count("%s")
        if text.startswith("SELECT "):
            text = "PERFORM " + text.removeprefix("SELECT ")
        body.append(f"    {text};\n    GET DIAGNOSTICS _da_n = ROW_COUNT;\n"
                    "    _da_counts := _da_counts || _da_n;")  # fmt: skip
    source = (
        f"({', '.join(kinds)}) RETURNS bigint[] LANGUAGE plpgsql AS $fn$\n"
        "DECLARE _da_counts bigint[] := ARRAY[]::bigint[]; _da_n bigint;\nBEGIN\n"
        + "\n".join(body)
        + "\n    RETURN _da_counts;\nEND\n$fn$"
    )
    name = "agent_write_" + hashlib.sha256(source.encode()).hexdigest()[:24]
    return name, f"CREATE FUNCTION {name}{source}"
