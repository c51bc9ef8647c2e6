"""The Durable Object store: sessions in the object's own SQLite (`ctx.storage.sql`).

Use `durable_object_store(self.ctx.storage)` inside a Durable Object class
whose migration declares it in `new_sqlite_classes`. Same schema, same SQL
and the same contract as the SQLite and D1 stores (`stores/_statements.py`); what
differs is where the database lives: inside the object, local, synchronous,
no network hop per write. A session stored here is visible to that object
only and is gone with `ctx.storage.deleteAll()`.

How it uses the storage API (workerd's `DurableObjectStorage`):
- `storage.sql.exec(query, *bindings)` runs at once and returns a cursor;
  rows are read with `cursor.raw()` (positional rows). Reads are synchronous;
  the methods stay `async def` for the `Store` protocol. One statement per
  call (of several, workerd returns the last one's rows only).
- What it binds: workerd binds a JS `true` as the text 'true' and refuses a
  BigInt (`TypeError: Cannot convert a BigInt value to a number`), which a
  Python int beyond ±(2**53 - 2) becomes; so bools go as 0 / 1 and every int
  is checked first (`_limits.bound_params`).
- `storage.transactionSync(callback)` is the only transaction there is
  (workerd refuses BEGIN, SAVEPOINT and RELEASE): every write of an append (the
  message INSERTs, the session upsert, approvals, the lease) runs inside one
  callback, committed together or rolled back if it throws; the same statements
  as on D1, so a step of many tool calls is a few packed INSERTs here too, one
  `sql.exec` each rather than one per row. The schema's
  UNIQUE key and in-order trigger make an append at a stale position fail,
  exactly as on D1: `SessionConflictError`, nothing written.
- The schema (`stores/migrations/*.sql`, read by `stores/_schema.py`) is applied
  on a store's first use, in one
  transaction, only where something is missing: afterwards a first use costs
  reads of the catalogue (`sqlite_master`, and the columns of each table a
  migration added to: `_schema.altered_tables()`).

From Python (Pyodide), the callback handed to `transactionSync` is a
`create_proxy` destroyed after the call; an exception inside it rolls the
transaction back and is classified from the original Python exception (kept
aside before it crosses into JS), never from its JS re-wrapping. `None`
binds as JS `null`. Values come back as JS numbers and strings (numbers as
Python ints when integral, as D1's do); `stores/_rows.py`'s readers convert them.

This module imports nothing from the runtime at import time, so it imports
and type-checks on CPython, where any object with the same shape (see
`tests/cloudflare/test_do_store.py`'s sqlite3 stand-in) can back it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..errors import ConfigurationError, SessionConflictError, StoreError
from ..limits import MAX_ROW_BYTES
from ..messages import Message
from . import _appends, _limits, _paging, _rows, _schema, _statements
from .base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
)

__all__ = ["DurableObjectStore", "SqlStorageLike", "durable_object_store"]

# Durable Object storage refuses a value (a string or blob column) over 2 MB;
# MAX_ROW_BYTES (1.9 MB for content plus tool calls) keeps every row below it.
DO_MAX_VALUE_BYTES = 2 * 1024 * 1024

_SCHEMA_OBJECTS = "SELECT name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')"
_CHANGES = "SELECT changes()"


class SqlStorageLike(Protocol):
    """What the store uses of `ctx.storage`: `sql.exec(...)` and `transactionSync(fn)`."""

    @property
    def sql(self) -> Any: ...

    def transactionSync(self, callback: Callable[[], Any]) -> Any: ...


class _Rollback(Exception):
    """Raised inside `transactionSync`'s callback to roll it back; what was raised is kept aside."""


def _unwrap(storage: Any) -> Any:
    """The JS storage object behind the workers SDK's `_BindingWrapper`, if wrapped.

    The wrapper converts every result through its RPC converter; the SQL
    API is local and synchronous, so the store talks to the object itself."""
    inner = getattr(type(storage), "__name__", "") == "_BindingWrapper" and getattr(
        storage, "_binding", None
    )
    return inner if inner else storage


class DurableObjectStore:
    """A durable `Store` over a Durable Object's SQLite. Build it with
    `durable_object_store(self.ctx.storage)`; cheap to create."""

    def __init__(
        self,
        storage: Any,
        *,
        clock: Callable[[], float] | None = None,
        max_row_bytes: int = MAX_ROW_BYTES,
    ) -> None:
        if max_row_bytes >= DO_MAX_VALUE_BYTES:
            raise ConfigurationError(
                f"max_row_bytes must stay below Durable Object storage's "
                f"{DO_MAX_VALUE_BYTES}-byte value limit, not {max_row_bytes}"
            )
        self._storage = _unwrap(storage)
        self._clock = clock
        self._max_row_bytes = max_row_bytes
        self._ready = False
        self._pyodide = sys.platform == "emscripten"

    @property
    def durable(self) -> bool:
        return True

    def _now_ms(self) -> int:
        return int((self._clock or time.time)() * 1000)

    # --- the storage API, converted ---

    def _bind(self, sql: str, params: Sequence[Any]) -> list[Any]:
        # workerd binds True as the text 'true' and refuses a BigInt (a Python int
        # beyond ±(2**53 - 2)): bools go as 0 / 1, and such an int never goes.
        values = _limits.bound_params(sql, params)
        if not self._pyodide:
            return values
        from pyodide.ffi import jsnull  # type: ignore[import-not-found, attr-defined, unused-ignore]

        return [jsnull if p is None else p for p in values]

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._storage.sql.exec(sql, *self._bind(sql, params))

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[list[Any]]:
        raw = self._exec(sql, params).raw()
        if self._pyodide:
            import js  # type: ignore[import-not-found, unused-ignore]
            from pyodide.ffi import jsnull  # type: ignore[import-not-found, attr-defined, unused-ignore]

            # to_py() keeps SQL NULL as `jsnull`, not None.
            rows: list[list[Any]] = js.Array.from_(raw).to_py()
            return [[None if v is jsnull else v for v in row] for row in rows]
        return [list(row) for row in raw]

    def _changes(self) -> int:
        return int(self._rows(_CHANGES)[0][0])

    def _transaction(self, body: Callable[[], Any]) -> Any:
        """Run `body` in one `transactionSync`; re-raise what it raised, as raised."""
        raised: list[BaseException] = []
        result: list[Any] = []

        def callback() -> None:
            try:
                result.append(body())
            except BaseException as exc:
                raised.append(exc)
                # What crosses into JS (and makes transactionSync roll back) is a
                # plain exception of ours; the original is re-raised afterwards.
                raise _Rollback from None

        if self._pyodide:
            from pyodide.ffi import create_proxy  # type: ignore[import-not-found, unused-ignore]

            proxy = create_proxy(callback)
            try:
                self._storage.transactionSync(proxy)
            except BaseException as exc:
                if raised:
                    raise raised[0] from None
                raise exc
            finally:
                proxy.destroy()
        else:
            try:
                self._storage.transactionSync(callback)
            except BaseException:
                if raised:
                    raise raised[0] from None
                raise
        return result[0] if result else None

    # --- schema ---

    def create_tables(self) -> None:
        """Bring the object's database to the kit's schema (idempotent; also done on first use)."""
        try:
            existing = {str(row[0]) for row in self._rows(_SCHEMA_OBJECTS)}
            columns = {
                table: {str(row[1]) for row in self._rows(_schema.table_info(table))}
                for table in _schema.altered_tables()
            }
        except Exception as exc:
            raise StoreError(f"the Durable Object store could not read its schema: {exc}") from exc
        if _schema.is_current(existing, columns):
            self._ready = True
            return
        plan = _schema.schema_plan(columns)

        def apply() -> None:
            for statement in plan:
                self._exec(statement)

        try:
            self._transaction(apply)
        except Exception as exc:
            raise StoreError(
                f"the Durable Object store could not create its schema: {exc}"
            ) from exc
        self._ready = True

    def _ensure(self) -> None:
        if not self._ready:
            self.create_tables()

    def _read(self, sql: str, params: Sequence[Any], what: str) -> list[list[Any]]:
        self._ensure()
        try:
            return self._rows(sql, params)
        except Exception as exc:
            raise StoreError(f"the Durable Object store failed to {what}: {exc}") from exc

    # --- the Store protocol ---

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        params = _statements.page_params(session_id, start, limit)
        rows = self._read(
            _statements.SELECT_MESSAGES_FROM, params, f"load the messages of session {session_id!r}"
        )
        return _rows.row_messages(session_id, rows, start=params[1])

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        rows = self._read(
            _statements.SELECT_CONTEXT, (session_id, session_id),
            f"load the recent messages of session {session_id!r}",
        )  # fmt: skip
        return _rows.context_rows(session_id, rows)

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        rows = self._read(
            _statements.FIND_REQUEST, (session_id, request_key),
            f"find request key {request_key[:80]!r} in session {session_id!r}",
        )  # fmt: skip
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    async def append_messages_atomic(
        self,
        session_id: str,
        expected_seq: int,
        messages: Sequence[Message],
        *,
        agent_name: str | None = None,
        lease: Lease | None = None,
        approvals: Sequence[ApprovalChange] = (),
        session_name: str | None = None,
        schedules: Sequence[Schedule] = (),
    ) -> int:
        statements = _appends.append_statements(
            session_id, expected_seq, messages, self._now_ms(),
            agent_name=agent_name, lease=lease, approvals=approvals,
            max_row_bytes=self._max_row_bytes, session_name=session_name,
            schedules=schedules,
        )  # fmt: skip
        self._ensure()

        def write() -> None:
            for sql, params in statements:
                self._exec(sql, params)

        try:
            self._transaction(write)
        except Exception as exc:
            text = str(exc)
            if _statements.is_conflict(text) or _statements.is_approval_conflict(text):
                raise SessionConflictError(session_id, expected_seq, text) from exc
            raise StoreError(
                f"the Durable Object store failed to append {len(messages)} message(s) to "
                f"session {session_id!r} at position {expected_seq}; the transaction was rolled "
                f"back, nothing was written: {text}",
                session_id=session_id,
            ) from exc
        return expected_seq + len(messages)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        rows = self._read(
            _statements.SELECT_APPROVALS,
            (session_id,),
            f"load the approvals of session {session_id!r}",
        )
        return [_rows.row_approval_event(row, session_id) for row in rows]

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        params = _statements.acquire_lease_params(
            session_id, owner, self._now_ms(), ttl_ms, take_from
        )
        self._ensure()

        def take() -> list[list[Any]]:
            self._exec(_statements.ACQUIRE_LEASE, params)
            return self._rows(_statements.SELECT_LEASE, (session_id,))

        try:
            rows: list[list[Any]] = self._transaction(take)
        except Exception as exc:
            raise StoreError(
                f"the Durable Object store failed to take the lease of session "
                f"{session_id!r}: {exc}",
                session_id=session_id,
            ) from exc
        holder, expires_at = rows[0]
        # The upsert writes only when it takes the lease, and then names `owner`.
        if str(holder) == owner:
            return None
        return LeaseHolder(str(holder), int(expires_at))

    async def release_lease(self, session_id: str, owner: str) -> None:
        self._ensure()
        try:
            self._exec(_statements.RELEASE_LEASE, (session_id, owner))
        except Exception as exc:
            raise StoreError(
                f"the Durable Object store failed to release the lease of session "
                f"{session_id!r}: {exc}",
                session_id=session_id,
            ) from exc

    async def get_session(self, session_id: str) -> SessionInfo | None:
        rows = self._read(_statements.SELECT_SESSION, (session_id,), f"read session {session_id!r}")
        return _rows.row_session_info(rows[0]) if rows else None

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        rows = self._read(*_paging.list_statement(cursor, limit, agent_name), "list sessions")
        return SessionPage(*_paging.page_of([_rows.row_session_info(r) for r in rows], limit))

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        rows = self._read(_statements.FIND_SESSIONS, (name,), f"find sessions named {name!r}")
        return [_rows.row_session_info(row) for row in rows]

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        rows = self._read(
            _statements.SELECT_SCHEDULES,
            (session_id,),
            f"load the schedules of session {session_id!r}",
        )
        return [_rows.row_schedule(row) for row in rows]

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        self._ensure()

        def delete() -> int:
            self._exec(_statements.DELETE_SCHEDULE, (session_id, schedule_id))
            return self._changes()

        try:
            changed: int = self._transaction(delete)
        except Exception as exc:
            raise StoreError(
                f"the Durable Object store failed to delete schedule {schedule_id!r} of "
                f"session {session_id!r}: {exc}",
                session_id=session_id,
            ) from exc
        return changed > 0

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        params = _statements.page_params(session_id, start, limit)
        rows = self._read(
            _statements.SELECT_TIMELINE, params, f"load the timeline of session {session_id!r}"
        )
        return _rows.timeline_rows(session_id, rows, start=params[1])

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        """One transaction: each statement picks the same idle sessions (`DELETE_IDLE`)."""
        params = _statements.idle_params(before_ms, limit)
        self._ensure()

        def delete() -> int:
            for sql in _statements.DELETE_IDLE:
                self._exec(sql, params)
            return self._changes()

        try:
            deleted: int = self._transaction(delete)
        except Exception as exc:
            raise StoreError(
                f"the Durable Object store failed to delete sessions idle since {before_ms}: {exc}"
            ) from exc
        return deleted

    async def delete_session(self, session_id: str) -> bool:
        self._ensure()

        def delete() -> bool:
            self._exec(_statements.DELETE_MESSAGES, (session_id,))
            messages = self._changes()
            self._exec(_statements.DELETE_LEASE, (session_id,))
            self._exec(_statements.DELETE_APPROVALS, (session_id,))
            self._exec(_statements.DELETE_SCHEDULES, (session_id,))
            self._exec(_statements.DELETE_SESSION, (session_id,))
            return messages > 0 or self._changes() > 0

        try:
            found: bool = self._transaction(delete)
        except Exception as exc:
            raise StoreError(
                f"the Durable Object store failed to delete session {session_id!r}: {exc}",
                session_id=session_id,
            ) from exc
        return found


def durable_object_store(
    storage: Any,
    *,
    clock: Callable[[], float] | None = None,
    max_row_bytes: int = MAX_ROW_BYTES,
) -> DurableObjectStore:
    """A durable store in a Durable Object's own SQLite: `durable_object_store(self.ctx.storage)`.

    `storage` is `ctx.storage` as the workers SDK hands it (or its JS object;
    on CPython, anything with `sql.exec` and `transactionSync` of the same
    shape). `clock` returns seconds (default `time.time`); timestamps are
    stored as Unix milliseconds. `max_row_bytes` bounds one message row and
    must stay below Durable Object storage's 2 MB value limit.
    """
    return DurableObjectStore(storage, clock=clock, max_row_bytes=max_row_bytes)
