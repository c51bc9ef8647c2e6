"""Debian's chromium, driven by Playwright by its path: shared by the browser tests.

scripts/test installs the `chromium` package (Playwright's own browser download
is not used). Where it could not, it says why in DURABLE_AGENTS_NO_CHROMIUM and
the browser tests skip with that reason, and only then: a missing chromium
anywhere else fails them.

    # the fixtures `chromium` (its path) and `browser` (one per test module):
    from tests.support.headless_chromium import (  # noqa: F401 - fixtures
        browser_fixture, chromium_fixture)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

SKIP_REASON_VARIABLE = "DURABLE_AGENTS_NO_CHROMIUM"


def chromium_path() -> str:
    """The path of Debian's chromium binary; skips only with scripts/test's reason."""
    reason = os.environ.get(SKIP_REASON_VARIABLE)
    if reason:
        pytest.skip(f"Chromium cannot be installed on this machine: {reason}")
    path = shutil.which("chromium")
    assert path, (
        "Debian's chromium is not installed: scripts/test installs it "
        "(apt-get install chromium), or install it by hand"
    )
    return path


@pytest.fixture(scope="module", name="chromium")
def chromium_fixture() -> str:
    """The path of Debian's chromium binary."""
    return chromium_path()


@pytest.fixture(scope="module", name="browser")
def browser_fixture(chromium: str) -> Iterator[Browser]:
    """Headless chromium, one per test module."""
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to run as root (CI runs as root).
        launched = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()
