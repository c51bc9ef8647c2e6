from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_agents.cloudflare import d1_store
from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.testing.conformance import ticking_clock
from durable_agents.testing.fake_d1 import FakeD1Database
from durable_agents.testing.pytest_plugin import dev_worker  # noqa: F401 - the Worker harness


async def _make(kind: str, tmp_path: Path) -> tuple[Store, object]:
    if kind == "memory":
        return memory_store(clock=ticking_clock()), None
    if kind == "sqlite":
        store = sqlite_store(tmp_path / "store.db", clock=ticking_clock())
        return store, store
    database = FakeD1Database(str(tmp_path / "d1.db"))
    d1 = d1_store(database, clock=ticking_clock())
    await d1.create_tables()
    return d1, database


async def _close(resource: object) -> None:
    if isinstance(resource, FakeD1Database):
        resource.close()
    elif resource is not None:
        await resource.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "d1-fake", "memory"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every backend that runs on CPython, fresh and empty. (D1 on the real engine:
    tests/runtime/.)"""
    store, resource = await _make(request.param, tmp_path)
    yield store
    await _close(resource)


@pytest.fixture(params=["sqlite", "d1-fake"])
async def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every durable backend that runs on CPython, fresh and empty."""
    store, resource = await _make(request.param, tmp_path)
    yield store
    await _close(resource)
