#!/usr/bin/env python3
"""Benchmark: milliseconds per atomic D1 append (one 5-message batch), from Python inside workerd.

    python3 scripts/bench_d1.py [--appends 200] [--loads 50]

Stages a Worker of its own in a temp dir: scripts/bench_d1_worker.py as its entry,
the modules of `durable_agents` it imports (as scripts/build_worker.py stages the
kit's Worker), the kit's python_modules/, a D1 binding with the kit's migrations
(src/durable_agents/stores/migrations/).
Serves it with `scripts/dev --config` (runtime/dev.py: `wrangler dev` on real workerd,
offline; the local D1 is miniflare's, in another workerd service: a round trip per
batch), then asks it once for `--appends` appends and `--loads` loads, each timed
inside the Worker with workerd's clock (which moves at I/O: an append's time is its
Python work and its round trip to D1). Prints the dev server's start time, the median
and p90 ms per append, the median ms per `load_messages` of a 5-message session, and
the request's own wall time. stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_worker  # sibling scripts
from dev_process import PROJECT, DevServer, scratch_worker

WORKER = PROJECT / "scripts" / "bench_d1_worker.py"


def stage(project: Path) -> Path:
    """The bench Worker's project in `project`: its config (returned), worker/ and a link
    to the kit's python_modules/."""
    src = project / "src"
    shutil.copytree(
        PROJECT / "src" / "durable_agents",
        src / "durable_agents",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copy2(WORKER, src / "entry.py")
    build_worker.stage(project / "worker", src)  # what entry.py imports, and nothing else
    return scratch_worker(
        project, "worker/entry.py", name="bench-d1",
        d1_databases=[
            {
                "binding": "DB",
                "database_name": "bench-d1",
                "database_id": "00000000-0000-4000-8000-0000000bd1d1",
                "migrations_dir": str(PROJECT / "src/durable_agents/stores/migrations"),
            }
        ],
    )  # fmt: skip


def percentile_90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 10 else max(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--loads", type=int, default=50)
    args = parser.parse_args()
    if args.appends < 1 or args.loads < 1:
        parser.error("--appends and --loads must be at least 1")

    with tempfile.TemporaryDirectory(prefix="bench-d1-") as scratch:
        config = stage(Path(scratch) / "project")
        state = Path(scratch) / "state"
        dev_args = ["--config", str(config), "--persist-to", str(state)]
        with DevServer([*dev_args, "--dev-vars", os.path.join(scratch, "none")]) as server:
            print(
                f"dev server (wrangler dev, workerd) started in {server.start_s:.1f} s", flush=True
            )
            query = f"/?appends={args.appends}&loads={args.loads}&run={uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            with urllib.request.urlopen(server.url + query, timeout=600) as response:
                report = json.loads(response.read())
            wall_s = time.perf_counter() - t0

    appends, loads = report["append_ms"], report["load_ms"]
    expected = 5 * len(range(0, args.appends, 20))
    if report["stored_in_first_session"] != expected:
        raise SystemExit(
            f"bench: session 0 holds {report['stored_in_first_session']}, not {expected}"
        )
    print(
        f"atomic append of 5 messages (1 D1 batch): median {statistics.median(appends):.2f} ms, "
        f"p90 {percentile_90(appends):.2f} ms over {len(appends)} appends"
    )
    print(
        f"load_messages of a 5-message session: median {statistics.median(loads):.2f} ms "
        f"over {len(loads)} (workerd's clock counts whole ms)"
    )
    print(
        f"the request (10 warm-up appends, {len(appends)} appends, {len(loads)} loads): "
        f"{wall_s:.2f} s wall time"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
