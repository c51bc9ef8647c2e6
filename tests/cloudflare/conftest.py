"""Fixtures shared by the tests in tests/cloudflare/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.worker_fakes import PaymentsAPI


@pytest.fixture(scope="module")
def payments() -> Iterator[PaymentsAPI]:
    """The fake payments API (`worker_fakes.PaymentsAPI`), one per test module: a module's
    dev server (test_dev_server_approvals.py) is started once, pointed at it."""
    with PaymentsAPI() as api:
        yield api
