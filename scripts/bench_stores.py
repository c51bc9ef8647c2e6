#!/usr/bin/env python3
"""Benchmark: D1 vs the Durable Object's own SQLite (SESSION_STORE), through the dev server.

    python3 scripts/bench_stores.py [--requests 30] [--warmup 5] [--sizes 1000,10000]

Starts `scripts/dev` twice, side by side in one run (fresh state each,
the triage example with its offline model and dev stubs), once with
`SESSION_STORE=d1` and once with `SESSION_STORE=durable-object`, and prints:

- ms per triage turn (3 LLM steps, 5 atomic appends, 1 history load), per
  durable step and per append, median of `--requests` new sessions;
- the resume cost of a 1,000- and a 10,000-message session: `POST .../resume`
  on a finished session loads its whole history and answers the stored reply
  (no LLM call). The long histories are written straight into each store's
  SQLite file (D1's under v3/d1, the object's under v3/do: workerd keeps both in
  WAL mode, so a write from this process is seen by the running server) after
  one real turn made the session;
- each figure of the Durable Object store as a ratio to D1's.

The dev server is `wrangler dev` on real workerd (runtime/dev.py). Its local D1
is miniflare's, a Durable Object in another workerd service (a round trip per
statement or batch, as a Worker's D1 binding is a network hop on Cloudflare);
the session object's SQLite is the object's own storage, as on Cloudflare.
stdlib only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dev_server import measure, start_server  # a sibling script

TOKEN = "dev-token"


def call(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def database_of(kind: str, state_dir: str, session_id: str) -> str:
    if kind == "d1":
        pattern = os.path.join(state_dir, "v3", "d1", "miniflare-D1DatabaseObject", "*.sqlite")
    else:
        pattern = os.path.join(state_dir, "v3", "do", "*", f"{session_id}.sqlite")
    files = [f for f in glob.glob(pattern) if not f.endswith("metadata.sqlite")]
    if len(files) != 1:
        raise SystemExit(f"bench: expected one database for {kind} at {pattern}, found {files}")
    return files[0]


def grow(database: str, session_id: str, size: int) -> None:
    """Extend the finished session to `size` messages: question/answer pairs, ending on
    a final reply, in order (the append trigger holds), with its row's count."""
    with sqlite3.connect(database, timeout=30) as db:
        (start,) = db.execute(
            "SELECT COUNT(*) FROM agent_messages WHERE session_id = ?", (session_id,)
        ).fetchone()
        rows = []
        for seq in range(start, size):
            role = "user" if (seq - start) % 2 == 0 else "assistant"
            text = f"message {seq}: " + "lorem ipsum dolor sit amet " * 6
            rows.append((session_id, seq, role, text, 1_800_000_000_000 + seq))
        if rows[-1][2] != "assistant":
            rows.pop()
        db.executemany(
            "INSERT INTO agent_messages (session_id, seq, role, content, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        db.execute(
            "UPDATE agent_sessions SET message_count = ?, state = 'complete' WHERE id = ?",
            (start + len(rows), session_id),
        )


def resume_cost(url: str, kind: str, state_dir: str, size: int, n: int) -> float:
    name = f"long-{size}"
    made = call(url, "POST", f"/sessions/{name}/messages", {"message": "hello"})
    grow(database_of(kind, state_dir, made["session_id"]), made["session_id"], size)
    count = call(url, "GET", f"/sessions/{name}?limit=1")["message_count"]
    assert count in (size, size - 1), count
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        reply = call(url, "POST", f"/sessions/{name}/resume")
        times.append((time.perf_counter() - t0) * 1000)
        assert reply["status"] == "complete", reply
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    results: dict[str, dict[str, float]] = {}
    for kind in ("d1", "durable-object"):
        with tempfile.TemporaryDirectory() as state_dir:
            server = start_server(state_dir, {"SESSION_STORE": kind})
            url = server.url
            try:
                turn = measure(url, TOKEN, kind, "triage issue {i}", args.requests, args.warmup)
                figures = {
                    "ms per triage turn": turn["median"],
                    "ms per durable step": turn["median"] / turn["steps"],
                    "ms per append (turn / appends)": turn["median"] / turn["appends"],
                }
                for size in sizes:
                    figures[f"ms to resume a {size:,}-message session"] = resume_cost(
                        url, kind, state_dir, size, max(5, args.requests // 3)
                    )
                results[kind] = figures
                print(f"{kind}: dev server started in {server.start_s:.1f} s; measured", flush=True)
            finally:
                server.stop()

    d1, do = results["d1"], results["durable-object"]
    print(f"\n{'median, ms':<40}{'D1':>10}{'Durable Object':>16}{'DO / D1':>9}")
    for label in d1:
        print(f"{label:<40}{d1[label]:>10.1f}{do[label]:>16.1f}{do[label] / d1[label]:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
