"""The shared store contract, on every CPython backend. Backend specifics live beside it."""

from __future__ import annotations

import pytest

from durable_agents.stores import Store
from durable_agents.testing.conformance import CHECKS, Check


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_store_contract(any_store: Store, check: Check) -> None:
    await check(any_store)
