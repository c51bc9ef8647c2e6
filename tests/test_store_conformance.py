"""The shared store contract, on every CPython backend (PostgreSQL on a private server of
its own: tests/support/postgres_server.py). Backend specifics live beside it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tests.support.postgres_server import (
    Server,
    postgres_fixture,  # noqa: F401 - fixture
)

from durable_agents.stores import Store
from durable_agents.stores.postgres import PostgresStore
from durable_agents.testing.conformance import CHECKS, Check, ticking_clock


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_store_contract(any_store: Store, check: Check) -> None:
    await check(any_store)


@pytest.fixture(name="postgres_store")
async def postgres_store_fixture(postgres: Server) -> AsyncIterator[PostgresStore]:
    """A PostgreSQL store in a schema of its own, on this process's private server."""
    store = PostgresStore(postgres.fresh_dsn(), clock=ticking_clock())
    yield store
    await store.close()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_store_contract_on_postgres(postgres_store: PostgresStore, check: Check) -> None:
    await check(postgres_store)
