"""The Cloudflare D1 store: sessions in a D1 database, reached through a Worker's binding.

Use `d1_store(env.DB)` in a Worker (inside a Durable Object or a plain
Worker); on CPython use `sqlite_store(path)`, which keeps the same contract on
the same schema. Tables come from the migration files (`stores/migrations/*.sql`,
wrangler.toml's `migrations_dir`, applied with `wrangler d1 migrations apply`), never
from a request: `create_tables()` applies the same files, for tests and one-off scripts.

Why one `batch()` per append: D1 has no interactive transactions (`BEGIN`
is rejected) but runs a batch as one implicit transaction, all or nothing.
An append is therefore a batch of the message INSERTs plus the session
upsert; the schema's UNIQUE (session_id, seq) key and its in-order trigger
make the batch fail whole when another writer got there first, which is the
whole concurrency check. No read precedes the write. D1 counts each statement
of a batch as a query of the invocation (50 on Workers Free): a step of many
tool calls has its rows packed into a few statements (`_appends.append_statements`),
and every statement is checked against D1's limits before it is bound
(`_limits.check_statement`), which miniflare's D1 does not all enforce.

The binding is used as the `workers` SDK hands it to Python code:
`prepare(sql).bind(*args)`, `await stmt.raw()` (rows as lists), `await
stmt.run()`, `await db.batch([...])`; SQL errors raise
`pyodide.ffi.JsException` with D1's message. D1 refuses a BigInt bind
(`D1_TYPE_ERROR: Type 'bigint' not supported for value ...`), and Pyodide
makes one of any Python int beyond ±(2**53 - 2): every statement's ints are
checked before they are bound (`_limits.bound_params`). `testing.fake_d1` offers the
same shape on CPython over sqlite3. This module imports nothing from the
runtime, so it imports and type-checks on CPython.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from .. import budget
from ..errors import SessionConflictError, StoreError
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

__all__ = ["D1Binding", "D1PreparedStatement", "D1Store", "d1_store"]


class D1PreparedStatement(Protocol):
    """What the store uses of a D1 prepared statement (as wrapped by the workers SDK)."""

    def bind(self, *values: Any) -> D1PreparedStatement: ...

    def run(self) -> Awaitable[Mapping[str, Any]]: ...

    def raw(self) -> Awaitable[Sequence[Sequence[Any]]]: ...


class D1Binding(Protocol):
    """What the store uses of a D1 database binding (`env.DB` in a Worker)."""

    def prepare(self, sql: str) -> D1PreparedStatement: ...

    def batch(
        self, statements: list[D1PreparedStatement]
    ) -> Awaitable[Sequence[Mapping[str, Any]]]: ...


class D1Store:
    """A durable `Store` over a D1 binding. Build it with `d1_store(env.DB)`.

    Cheap to create: it holds the binding and nothing else, so make one per
    request. Every method is one D1 round trip.
    """

    def __init__(
        self,
        binding: D1Binding,
        *,
        clock: Callable[[], float] | None = None,
        max_row_bytes: int = MAX_ROW_BYTES,
    ) -> None:
        self._db = binding
        self._clock = clock
        self._max_row_bytes = max_row_bytes

    @property
    def durable(self) -> bool:
        return True

    def _now_ms(self) -> int:
        # time.time is looked up per call, not bound at import: module top
        # level must not read the clock on Workers (import-time snapshots).
        return int((self._clock or time.time)() * 1000)

    async def create_tables(self) -> None:
        """Create the schema if missing. For tests: deployments use the migration.

        One `prepare().run()` per statement: D1's multi-statement `exec()`
        splits on newlines and rejects the trigger's BEGIN...END body. A
        migration's ALTERs run only where its columns are missing
        (`_schema.schema_plan`), so calling it again is harmless.
        """
        columns: dict[str, set[str]] = {}
        for table in _schema.altered_tables():
            try:
                info = await self._db.prepare(_schema.table_info(table)).raw()
            except Exception as exc:
                raise StoreError(f"D1 could not read the schema: {_d1_message(exc)}") from exc
            columns[table] = {str(row[1]) for row in info}
        for statement in _schema.schema_plan(columns):
            try:
                await self._db.prepare(statement).run()
            except Exception as exc:
                first_line = statement.splitlines()[0]
                raise StoreError(f"D1 could not create the schema ({first_line}): {exc}") from exc

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        params = _statements.page_params(session_id, start, limit)
        rows = await self._read(
            _statements.SELECT_MESSAGES_FROM, params, f"load the messages of session {session_id!r}"
        )
        return _rows.row_messages(session_id, rows, start=params[1])

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        rows = await self._read(
            _statements.SELECT_CONTEXT, (session_id, session_id),
            f"load the recent messages of session {session_id!r}",
        )  # fmt: skip
        return _rows.context_rows(session_id, rows)

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        rows = await self._read(
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
        statements = [
            self._prepare(sql, params, session_id)
            for sql, params in _appends.append_statements(
                session_id, expected_seq, messages, self._now_ms(),
                agent_name=agent_name, lease=lease, approvals=approvals,
                max_row_bytes=self._max_row_bytes, session_name=session_name,
                schedules=schedules,
            )
        ]  # fmt: skip
        try:
            await self._batch(statements)
        except Exception as exc:
            if _statements.is_conflict(str(exc)) or _statements.is_approval_conflict(str(exc)):
                raise SessionConflictError(session_id, expected_seq, _d1_message(exc)) from exc
            text = _d1_message(exc)
            # A D1_ERROR is a statement that failed, and D1 rolled the whole batch
            # back. Anything else (a dropped connection, a timeout) may have come
            # after D1 committed: say so rather than promise nothing landed.
            outcome = (
                "nothing was written"
                if "D1_ERROR" in text
                else "the write may or may not have landed; reload the session (run with "
                "message=None) before retrying"
            )
            raise StoreError(
                f"D1 failed to append {len(messages)} message(s) to session {session_id!r} at "
                f"position {expected_seq}; {outcome}: {text}",
                session_id=session_id,
            ) from exc
        return expected_seq + len(messages)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        rows = await self._read(
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
        try:
            budget.spend(queries=1)
            result = await self._prepare(_statements.ACQUIRE_LEASE, params, session_id).run()
        except Exception as exc:
            raise StoreError(
                f"D1 failed to take the lease of session {session_id!r}: {_d1_message(exc)}",
                session_id=session_id,
            ) from exc
        if int(result["meta"]["changes"]) == 1:
            return None
        rows = await self._read(_statements.SELECT_LEASE, (session_id,), "read a lease")
        # Released between the two statements: report it as about to expire.
        owner_now, expires_at = rows[0] if rows else ("(released)", params[3])
        return LeaseHolder(str(owner_now), int(expires_at))

    async def release_lease(self, session_id: str, owner: str) -> None:
        try:
            budget.spend(queries=1)
            await self._db.prepare(_statements.RELEASE_LEASE).bind(session_id, owner).run()
        except Exception as exc:
            raise StoreError(
                f"D1 failed to release the lease of session {session_id!r}: {_d1_message(exc)}",
                session_id=session_id,
            ) from exc

    async def get_session(self, session_id: str) -> SessionInfo | None:
        rows = await self._read(
            _statements.SELECT_SESSION, (session_id,), f"read session {session_id!r}"
        )
        return _rows.row_session_info(rows[0]) if rows else None

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        rows = await self._read(*_paging.list_statement(cursor, limit, agent_name), "list sessions")
        return SessionPage(*_paging.page_of([_rows.row_session_info(r) for r in rows], limit))

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        rows = await self._read(_statements.FIND_SESSIONS, (name,), f"find sessions named {name!r}")
        return [_rows.row_session_info(row) for row in rows]

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        rows = await self._read(
            _statements.SELECT_SCHEDULES,
            (session_id,),
            f"load the schedules of session {session_id!r}",
        )
        return [_rows.row_schedule(row) for row in rows]

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        try:
            budget.spend(queries=1)
            result = await self._prepare(
                _statements.DELETE_SCHEDULE, (session_id, schedule_id), session_id
            ).run()
        except Exception as exc:
            raise StoreError(
                f"D1 failed to delete schedule {schedule_id!r} of session {session_id!r}: "
                f"{_d1_message(exc)}",
                session_id=session_id,
            ) from exc
        return int(result["meta"]["changes"]) > 0

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        params = _statements.page_params(session_id, start, limit)
        rows = await self._read(
            _statements.SELECT_TIMELINE, params, f"load the timeline of session {session_id!r}"
        )
        return _rows.timeline_rows(session_id, rows, start=params[1])

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        """One batch: each statement picks the same idle sessions (`_statements.DELETE_IDLE`)."""
        params = _statements.idle_params(before_ms, limit)
        try:
            results = await self._batch(
                [self._prepare(sql, params) for sql in _statements.DELETE_IDLE]
            )
        except Exception as exc:
            raise StoreError(
                f"D1 failed to delete sessions idle since {before_ms}: {_d1_message(exc)}"
            ) from exc
        return int(results[-1]["meta"]["changes"])

    async def idle_sessions(self, before_ms: int, *, limit: int = 100) -> list[SessionInfo]:
        """Up to `limit` sessions last written before `before_ms`, oldest first (for the
        retention of sessions kept elsewhere: their index rows live here)."""
        rows = await self._read(
            _statements.SELECT_IDLE, _statements.idle_params(before_ms, limit), "find idle sessions"
        )
        return [_rows.row_session_info(row) for row in rows]

    async def put_session_summary(self, info: SessionInfo) -> None:
        """Mirror a session kept in another store (a Durable Object's SQLite) as its
        index row here: one write, so listing and retention see it."""
        params = _rows.session_summary_params(info)
        try:
            budget.spend(queries=1)
            await self._prepare(_statements.PUT_SESSION_SUMMARY, params, info.id).run()
        except Exception as exc:
            raise StoreError(
                f"D1 failed to index session {info.id!r}: {_d1_message(exc)}", session_id=info.id
            ) from exc

    async def delete_session(self, session_id: str) -> bool:
        try:
            results = await self._batch(
                [
                    self._db.prepare(_statements.DELETE_MESSAGES).bind(session_id),
                    self._db.prepare(_statements.DELETE_LEASE).bind(session_id),
                    self._db.prepare(_statements.DELETE_APPROVALS).bind(session_id),
                    self._db.prepare(_statements.DELETE_SCHEDULES).bind(session_id),
                    self._db.prepare(_statements.DELETE_SESSION).bind(session_id),
                ]
            )
        except Exception as exc:
            raise StoreError(
                f"D1 failed to delete session {session_id!r}: {_d1_message(exc)}",
                session_id=session_id,
            ) from exc
        deleted_messages, *_, deleted_session = results
        return any(int(r["meta"]["changes"]) > 0 for r in (deleted_messages, deleted_session))

    async def _batch(self, statements: Sequence[Any]) -> Any:
        """`db.batch(statements)`: each statement a query of the invocation (`budget`)."""
        budget.spend(queries=len(statements))
        return await self._db.batch(list(statements))

    def _prepare(
        self, sql: str, params: Sequence[Any], session_id: str | None = None
    ) -> D1PreparedStatement:
        """`prepare(sql).bind(...)`, each value as D1 takes it (`_limits.bound_params`: D1
        refuses a BigInt, which a Python int beyond ±(2**53 - 2) becomes)."""
        return self._db.prepare(sql).bind(*_limits.bound_params(sql, params, session_id))

    async def _read(self, sql: str, params: Sequence[Any], what: str) -> Sequence[Sequence[Any]]:
        statement = self._prepare(sql, params)
        try:
            budget.spend(queries=1)
            return await statement.raw()
        except Exception as exc:
            raise StoreError(f"D1 failed to {what}: {_d1_message(exc)}") from exc


def d1_store(
    binding: Any,
    *,
    clock: Callable[[], float] | None = None,
    max_row_bytes: int = MAX_ROW_BYTES,
) -> D1Store:
    """A durable store over a D1 binding: `d1_store(self.env.DB)` inside a Worker.

    `binding` is the D1 binding as the workers SDK exposes it (or
    `testing.fake_d1.FakeD1Database` on CPython). `clock` returns seconds
    (default `time.time`); timestamps are stored as Unix milliseconds.
    `max_row_bytes` bounds one message row, below D1's 2,000,000-byte limit.
    """
    return D1Store(binding, clock=clock, max_row_bytes=max_row_bytes)


def _d1_message(exc: BaseException) -> str:
    # A JsException's str() starts with the JS error name ("Error: D1_ERROR: ...").
    text = str(exc)
    return text.removeprefix("Error: ")
