"""Crash at every write boundary and inside every handler, on every durable CPython backend."""

from __future__ import annotations

import pytest
from tests.support.crash_sweep import sweep

from durable_agents.stores import Store


async def test_every_crash_point_keeps_tools_at_most_once(
    durable_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    report = await sweep(durable_store)
    with capsys.disabled():
        print(f"\n  crash sweep on {type(durable_store).__name__}: {report}")
    assert report.scenarios == 2 * (report.baseline_appends + report.baseline_handler_calls)
