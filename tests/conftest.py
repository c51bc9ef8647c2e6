from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.testing.conformance import ticking_clock

StoreFactory = Callable[[], Store]


@pytest.fixture(params=["sqlite", "memory"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every backend that runs on CPython, fresh and empty."""
    if request.param == "memory":
        yield memory_store(clock=ticking_clock())
        return
    store = sqlite_store(tmp_path / "store.db", clock=ticking_clock())
    yield store
    await store.close()


@pytest.fixture(params=["sqlite"])
async def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every durable backend that runs on CPython, fresh and empty."""
    store = sqlite_store(tmp_path / "store.db", clock=ticking_clock())
    yield store
    await store.close()
