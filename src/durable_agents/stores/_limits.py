"""D1's limits, held by every SQL store: the integers a statement may bind, the size of
one statement and of one batch, and the checks that refuse what D1 would refuse.

Every append and every statement D1 or a Durable Object runs is checked here first
(`check_batch`, `check_statement`, `bound_params`), so a local run fails where
Cloudflare would. Guide: docs/limits.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .. import limits
from ..errors import ConfigurationError, StoreError

# The largest magnitude of an integer any statement binds. On Workers a Python int
# reaches JavaScript (D1's `bind`, a Durable Object's `sql.exec`) as a Number only if
# |n| < 2**53 - 1: Pyodide's test is strict, so Number.MAX_SAFE_INTEGER itself arrives
# as a BigInt, and both refuse a BigInt (D1: "D1_TYPE_ERROR: Type 'bigint' not
# supported for value ..."; Durable Object SQL: "TypeError: Cannot convert a BigInt
# value to a number"). Every store keeps to the same range, so what one stores, any
# other can. Measured on workerd by tests/cloudflare/test_workerd_behaviour.py.
MAX_BOUND_INT = limits.MAX_BOUND_INT


def clamp_int(value: int) -> int:
    """`value` within ±MAX_BOUND_INT (for bounds, where the rows picked stay the same)."""
    return max(-MAX_BOUND_INT, min(MAX_BOUND_INT, value))


def bindable(value: int, what: str, session_id: str | None = None) -> int:
    """`value` if every store can bind it; else a `StoreError` that names it."""
    if -MAX_BOUND_INT <= value <= MAX_BOUND_INT:
        return value
    where = "" if session_id is None else f"session {session_id!r}: "
    raise StoreError(
        f"{where}{what} is {value}, beyond ±{MAX_BOUND_INT}, the integers D1 and Durable "
        "Object SQL can bind (a larger Python int reaches them as a JavaScript BigInt, "
        "which they refuse); nothing was written",
        session_id=session_id,
    )


# D1's limits on one statement, which hold for each statement of a batch too
# (developers.cloudflare.com/d1/platform/limits) and which a Durable Object's SQLite
# shares: bound parameters, bytes of SQL text, and bytes of one string or BLOB value.
# And the statements of one batch: D1 counts each as a query of the invocation, and
# a Worker invocation on Workers Free may make 50 (on Paid, 1,000). Local workerd
# refuses the first two; miniflare's D1 takes an over-long value and any batch, and
# SQLite on CPython takes everything, so `check_statement` and `check_batch` do the
# refusing on every backend, before anything is written.
MAX_BOUND_PARAMS = 100
MAX_SQL_BYTES = 100_000
MAX_VALUE_BYTES = 2_000_000
MAX_BATCH_STATEMENTS = 50

Statement = tuple[str, tuple[Any, ...]]

_TABLE = re.compile(r"(?:INTO|UPDATE|FROM)\s+(\w+)")


def _statement_name(sql: str) -> str:
    table = _TABLE.search(sql)  # only to name the statement in an error
    return repr(table[1] if table else sql[:40])


def text_bytes(value: str) -> int:
    # A lone surrogate is counted, not refused: what binding does with it is each
    # backend's own business, as it was before the count.
    return len(value.encode("utf-8", "surrogatepass"))


def check_statement(sql: str, params: Sequence[Any], session_id: str | None = None) -> None:
    """`StoreError` if one statement is past a D1 limit on statements (see MAX_BOUND_PARAMS)."""
    problem = None
    if len(params) > MAX_BOUND_PARAMS:
        problem = f"binds {len(params)} parameters (D1 allows {MAX_BOUND_PARAMS})"
    elif len(sql) * 4 > MAX_SQL_BYTES and text_bytes(sql) > MAX_SQL_BYTES:
        problem = f"is {text_bytes(sql)} bytes of SQL (D1 allows {MAX_SQL_BYTES})"
    else:
        for value in params:
            size = (
                text_bytes(value) if isinstance(value, str) and len(value) * 4 > MAX_VALUE_BYTES
                else len(value) if isinstance(value, bytes) else 0
            )  # fmt: skip
            if size > MAX_VALUE_BYTES:
                problem = f"binds a value of {size} bytes (D1 allows {MAX_VALUE_BYTES})"
                break
    if problem is not None:
        where = "" if session_id is None else f"session {session_id!r}: "
        raise StoreError(
            f"{where}the statement on {_statement_name(sql)} {problem}; nothing was written",
            session_id=session_id,
        )


def check_batch(statements: Sequence[Statement], session_id: str | None = None) -> list[Statement]:
    """`statements` if D1 would run them as one batch (see MAX_BATCH_STATEMENTS), each
    checked by `check_statement`; else `StoreError`."""
    if len(statements) > MAX_BATCH_STATEMENTS:
        where = "" if session_id is None else f"session {session_id!r}: "
        raise StoreError(
            f"{where}one write needs {len(statements)} statements, more than the "
            f"{MAX_BATCH_STATEMENTS} D1 runs in one batch; nothing was written",
            session_id=session_id,
        )
    for sql, params in statements:
        check_statement(sql, params, session_id)
    return list(statements)


def bound_params(sql: str, params: Sequence[Any], session_id: str | None = None) -> list[Any]:
    """`sql`'s parameters as D1 and Durable Object SQL must get them: a bool as the int
    0 or 1 (Durable Object SQL binds True as the text 'true'), every int within
    ±MAX_BOUND_INT, the statement within D1's limits (`check_statement`); else
    `StoreError`, before anything is bound."""
    check_statement(sql, params, session_id)
    bound: list[Any] = []
    for value in params:
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, int) and not -MAX_BOUND_INT <= value <= MAX_BOUND_INT:
            bindable(value, f"a value bound to {_statement_name(sql)}", session_id)
        bound.append(value)
    return bound


def check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be a positive integer, not {limit!r}")


def bound_limit(limit: int) -> int:
    """A checked `limit` as a statement binds it: no larger than any store can bind
    (a limit beyond every row reads the same rows)."""
    check_limit(limit)
    return min(limit, MAX_BOUND_INT)
