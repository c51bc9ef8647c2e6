"""A sqlite3 stand-in for a Durable Object's `ctx.storage` (its SQL half), for the
Durable Object store's CPython tests.

It has the shape of workerd's API (`sql.exec(query, *bindings)` returning a cursor
with `raw()`; `transactionSync(fn)` committing fn's writes or rolling them back if it
throws) and binds as workerd does from Python (measured on workerd by
tests/cloudflare/test_workerd_behaviour.py): True as the text 'true', an int beyond
+-(2**53 - 2) refused (Pyodide makes it a BigInt), BEGIN / SAVEPOINT / RELEASE refused
(transactionSync is the only transaction). The store on the real runtime:
tests/runtime/test_do_store.py.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any


class _Cursor:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def raw(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


_TRANSACTION = re.compile(r"^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b", re.I)


def _as_workerd_binds(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not -(2**53 - 1) < value < 2**53 - 1:
        raise TypeError("Cannot convert a BigInt value to a number")
    return value


class _Sql:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self.statements: list[str] = []
        self.bound: list[Any] = []

    def exec(self, query: str, *bindings: Any) -> _Cursor:
        if _TRANSACTION.match(query):
            raise RuntimeError(
                "To execute a transaction, please use the state.storage.transaction() or "
                "state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION or "
                "SAVEPOINT statements."
            )
        self.statements.append(query)
        self.bound += bindings
        values = tuple(_as_workerd_binds(v) for v in bindings)
        return _Cursor(self._connection.execute(query, values).fetchall())


class FakeDurableObjectStorage:
    """`ctx.storage`'s SQL half on sqlite3 (autocommit outside transactionSync, as on workerd)."""

    def __init__(self) -> None:
        self.connection = sqlite3.connect(":memory:", isolation_level=None)
        self.sql = _Sql(self.connection)
        self.transactions = 0

    def transactionSync(self, callback: Callable[[], Any]) -> Any:
        self.transactions += 1
        self.connection.execute("SAVEPOINT tx")
        try:
            result = callback()
        except BaseException:
            self.connection.execute("ROLLBACK TO tx")
            self.connection.execute("RELEASE tx")
            raise
        self.connection.execute("RELEASE tx")
        return result
