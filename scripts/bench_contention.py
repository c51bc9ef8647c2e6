"""Two processes playing turns on ONE SQLite session at once: with and without the run lease.

    .venv/bin/python scripts/bench_contention.py [--turns 40] [--processes 2]

Each process sends `--turns` messages to the same session, one after the
other. A turn is: an LLM call (5 ms) that asks for `post` (a side effect,
not `safe_to_retry`, 5 ms), write #2, an LLM call (5 ms) for the reply. A run
that loses a race (`SessionConflictError`) or gives up waiting
(`SessionBusyError`) is counted and the process goes on with its next turn.

Without the lease (`run(lease_seconds=None)`) the schema alone guards the
session: it stays safe (at most one post per call), but each run repairs the
other's in-flight post as an orphan. With it, the runs take turns. Printed
side by side, in one run, on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    SessionBusyError,
    SessionConflictError,
    ToolCall,
    ToolDurabilityError,
    ToolSpec,
    run,
    tool,
)
from durable_agents.stores import sqlite_store

SESSION = "shared"
THINK_S = 0.005
HANDLER_S = 0.005


class TurnLLM:
    """Asks for one post per user message, then replies."""

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        await asyncio.sleep(THINK_S)
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall("", "post", {"text": last.content})])
        return LLMResponse(text="posted")


def make_agent(effects: Path) -> Agent:
    @tool
    async def post(args: dict[str, Any]) -> str:
        """Post a message."""
        with effects.open("a") as f:
            f.write(args["text"] + "\n")
        await asyncio.sleep(HANDLER_S)
        return "ok"

    return Agent("poster", "Post each message.", [post])


async def play(db: str, effects: Path, name: str, turns: int, lease: bool) -> dict[str, int]:
    counts = {"complete": 0, "conflict": 0, "busy": 0, "other": 0}
    agent, llm = make_agent(effects), TurnLLM()
    async with sqlite_store(db) as store:
        for t in range(turns):
            try:
                result = await run(
                    agent,
                    llm=llm,
                    message=f"{name} turn {t}",
                    session_id=SESSION,
                    store=store,
                    lease_seconds=30.0 if lease else None,
                )
                counts["complete" if result.status == "complete" else "other"] += 1
            except SessionConflictError:
                counts["conflict"] += 1
            except SessionBusyError:
                counts["busy"] += 1
    return counts


def worker(db: str, effects: str, name: str, turns: int, lease: bool, start: Any, out: Any) -> None:
    start.wait()
    out.put(asyncio.run(play(db, Path(effects), name, turns, lease)))


def trial(workdir: Path, processes: int, turns: int, lease: bool) -> dict[str, Any]:
    tag = "lease" if lease else "nolease"
    db, effects = workdir / f"{tag}.db", workdir / f"{tag}.effects"
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(str(db), str(effects), f"p{i}", turns, lease, start, out))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every child import before the start
    began = time.perf_counter()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join()
    history = asyncio.run(_load(db))
    posts = effects.read_text().splitlines() if effects.exists() else []
    calls = [c for m in history for c in m.tool_calls]
    lost = sum(1 for m in history if ToolDurabilityError.from_message(m) is not None)
    total = {k: sum(r[k] for r in results) for k in results[0]}
    return {
        "turns asked": processes * turns,
        "turns completed": total["complete"],
        "SessionConflictError": total["conflict"],
        "SessionBusyError": total["busy"],
        "other endings": total["other"],
        "posts made": len(posts),
        "posts stored as calls": len(calls),
        "posts answered with a durability error": lost,
        "a post made twice": len(posts) - len(set(posts)),
        "wall time, s": round(elapsed, 2),
        "completed turns/s": round(total["complete"] / elapsed, 1),
    }


async def _load(db: Path) -> list[Message]:
    async with sqlite_store(db) as store:
        return await store.load_messages(SESSION)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    print(f"bench_contention: {args.processes} processes x {args.turns} turns, one session")
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    with tempfile.TemporaryDirectory(prefix="bench_contention-") as tmp:
        without = trial(Path(tmp), args.processes, args.turns, lease=False)
        with_lease = trial(Path(tmp), args.processes, args.turns, lease=True)
    width = max(map(len, without))
    print(f"{'':{width}}  {'no lease':>12}  {'lease':>12}")
    for key in without:
        print(f"{key:{width}}  {without[key]:>12}  {with_lease[key]:>12}")
    print(json.dumps({"without_lease": without, "with_lease": with_lease}))


if __name__ == "__main__":
    main()
