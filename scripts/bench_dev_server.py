#!/usr/bin/env python3
"""Benchmark: milliseconds per durable step through the dev server, with local D1.

    python3 scripts/bench_dev_server.py [--requests 50] [--warmup 5]
    python3 scripts/bench_dev_server.py --url http://127.0.0.1:8787 --token dev-token

Starts `scripts/dev` (runtime/dev.py: `wrangler dev` on real workerd, offline;
D1 and the Durable Objects are workerd's, persisted under the state dir) on a
free port with a fresh state dir (unless `--url` names a running server),
serving the triage example (`--agent examples/triage/agent.py`) with its
offline model and its dev stubs for the issue tracker and Slack, so what is
measured is the kit: HTTP
-> Worker -> Durable Object -> run() with D1 reads and atomic appends, plus
the tools' HTTP calls to the stubs. Each request is a new session:

- a triage turn ("triage issue N"): 3 LLM steps (get_issue, post_slack,
  the reply), 5 atomic D1 appends, 1 history load;
- a plain turn ("hello"): 1 LLM step, 1 append, 1 load.

Prints the median (and p90) ms per request, per durable step (request time
divided by its LLM steps) and per append. stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dev_process import PROJECT, DevServer  # a sibling script

AGENT = PROJECT / "examples" / "triage" / "agent.py"


def start_server(state_dir: str, env: dict[str, str] | None = None) -> DevServer:
    """`scripts/dev` serving the triage example with its stubs, on a fresh state dir
    (and no .dev.vars: `--dev-vars` names a file that does not exist)."""
    args = ["--persist-to", state_dir, "--dev-vars", os.path.join(state_dir, "none")]
    return DevServer([*args, "--agent", str(AGENT)], env=env).start()


def post(url: str, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        reply: dict[str, Any] = json.loads(response.read())
    if reply.get("status") != "complete":
        raise SystemExit(f"bench: a turn did not complete: {reply}")
    return reply


def measure(url: str, token: str, label: str, text: str, n: int, warmup: int) -> dict[str, Any]:
    times, steps = [], 0
    for i in range(warmup + n):
        t0 = time.perf_counter()
        reply = post(url, token, f"/sessions/bench-{label}-{i}-{time.time_ns()}/messages",
                     {"message": text.format(i=i)})  # fmt: skip
        elapsed = (time.perf_counter() - t0) * 1000
        if i >= warmup:
            times.append(elapsed)
            steps = reply["steps"]
    median = statistics.median(times)
    p90 = statistics.quantiles(times, n=10)[-1] if len(times) >= 10 else max(times)
    appends = 2 * (steps - 1) + 1  # write #1 and #2 per tool step, one final write
    return {"median": median, "p90": p90, "steps": steps, "appends": appends}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="measured requests per kind")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--url", help="a running dev server (default: start one)")
    parser.add_argument("--token", default="dev-token")
    args = parser.parse_args()

    server = None
    with tempfile.TemporaryDirectory() as state_dir:
        try:
            if args.url:
                url = args.url.rstrip("/")
            else:
                server = start_server(state_dir)
                url = server.url
                print(
                    f"dev server (wrangler dev, workerd) started in {server.start_s:.1f} s "
                    "(fresh state, triage example, dev stubs)",
                    flush=True,
                )
            for label, text in (("triage", "triage issue {i}"), ("plain", "hello")):
                r = measure(url, args.token, label, text, args.requests, args.warmup)
                print(
                    f"{label} turn ({r['steps']} LLM steps, {r['appends']} D1 appends), "
                    f"n={args.requests}: median {r['median']:.1f} ms/request (p90 {r['p90']:.1f}), "
                    f"{r['median'] / r['steps']:.1f} ms per durable step, "
                    f"{r['median'] / r['appends']:.1f} ms per append",
                    flush=True,
                )
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
