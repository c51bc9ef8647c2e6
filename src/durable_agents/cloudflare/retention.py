"""The retention cron: delete the sessions idle for more than `RETENTION_DAYS`, a few
batches per run (D1 counts each statement). The guide is docs/operating.md#deletion-and-retention.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ConfigurationError
from ..limits import MAX_BOUND_INT
from ..llm.settings import setting
from ..stores.base import SessionInfo

__all__ = ["RETENTION_BATCH", "RETENTION_MAX_BATCHES", "RETENTION_OBJECTS", "run_retention"]

# D1 counts every statement against a Worker invocation's query limit (50 on the free
# plan): a retention run deletes at most this many batches of sessions.
RETENTION_BATCH = 100
RETENTION_MAX_BATCHES = 8
RETENTION_OBJECTS = 40  # with SESSION_STORE = "durable-object": one subrequest each


async def run_retention(
    store: Any,
    env: Any,
    now: float | None = None,
    *,
    delete_object: Callable[[SessionInfo], Awaitable[Any]] | None = None,
) -> int:
    """The cron's work: delete the sessions idle for more than `RETENTION_DAYS` (unset or
    empty: keep everything), up to RETENTION_BATCH x RETENTION_MAX_BATCHES per run, each
    batch one atomic write. `now`: Unix seconds (default: the clock, read now). Returns
    how many were deleted.

    With `delete_object` (SESSION_STORE = "durable-object"), `store` is the D1 index:
    up to RETENTION_OBJECTS idle sessions are found there and each is deleted by its own
    Durable Object (`delete_object(info)`: one subrequest each, so few per run)."""
    now = time.time() if now is None else now
    raw = setting(env, "RETENTION_DAYS")
    if raw is None or str(raw).strip() == "":
        return 0
    try:
        days = float(str(raw))
    except ValueError:
        days = 0
    if not days > 0:
        raise ConfigurationError(f"RETENTION_DAYS must be a positive number, got {raw!r}")
    # A days count past any stored time (RETENTION_DAYS=1e300, inf) keeps everything.
    before_ms = int(max(-MAX_BOUND_INT, min(MAX_BOUND_INT, (now - days * 86400) * 1000)))
    deleted = 0
    if delete_object is not None:
        for info in await store.idle_sessions(before_ms, limit=RETENTION_OBJECTS):
            await delete_object(info)
            deleted += 1
        return deleted
    for _ in range(RETENTION_MAX_BATCHES):
        count = await store.delete_idle(before_ms, limit=RETENTION_BATCH)
        deleted += count
        if count < RETENTION_BATCH:
            break
    return deleted
