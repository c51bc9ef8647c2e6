"""The D1 migration applies with `wrangler d1 migrations apply --local`, offline.

Runs scripts/check_d1_migrations.mjs (wrangler + the local runtime on one
persisted database); needs `scripts/setup-runtime`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def test_wrangler_applies_the_migration_and_shares_data_with_the_runtime() -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed; run scripts/setup-runtime"
    result = subprocess.run(
        [node, str(PROJECT / "scripts" / "check_d1_migrations.mjs")],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrangler d1 execute --local sees the runtime's rows: ok" in result.stdout
