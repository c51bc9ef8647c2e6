#!/usr/bin/env python3
"""Benchmark: a durable step on PostgreSQL, against the server's commit floor and DBOS.

    .venv/bin/python scripts/bench_postgres.py [--steps 200] [--sessions 1,4,16] [--no-dbos]

Starts a private PostgreSQL server (Debian's package, as the tests do:
tests/support/postgres_server.py) with fsync and `synchronous_commit=on`, on a Unix
socket, and runs on it, side by side in one run, for 1, 4 and 16 sessions at once (one
task or thread each, `--steps` steps each), the workload of `bench_core.py`: every step
the model (answering instantly) asks for one tool call with a 200-character argument,
the tool answers 300 characters.

- floor: what two bare commits cost there (a step of the kit commits twice: the call,
  then its result): two autocommit INSERTs of those rows into a plain table, one
  connection per session (psycopg, async).
- kit: `run()` on `postgres_store(dsn)`, a session per task, one store (its pool) for all.
- DBOS: DBOS Transact 3.x on the same server (its own database), the documented use: a
  `@DBOS.workflow()` calling a `@DBOS.step()` per tool call, one thread per session.
  Installed by this script into its own virtualenv, `.cache/dbos-venv` (`pip install
  'dbos>=3,<4'`), never into .venv; it runs there, in a subprocess.

Each figure is the median of `--repeats` runs, the three sides interleaved. Prints
steps/s (all sessions together) and ms per step, and the kit's time per step
as a ratio to the floor's and to DBOS's (below 1: the kit is faster). No assertion on
timing: the checks only make sure each side did the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]

from bench_workload import (  # noqa: E402 - a sibling script: the workload
    ARGUMENT_CHARS,
    RESULT_CHARS,
    USER_MESSAGE,
    InstantLLM,
    filler,
    make_agent,
)
from tests.support.postgres_server import LocalPostgres  # noqa: E402 - the tests' server

from durable_agents import run  # noqa: E402
from durable_agents.stores.postgres import postgres_store  # noqa: E402

DBOS_VENV = ROOT / ".cache" / "dbos-venv"
DBOS_REQUIREMENT = "dbos>=3,<4"

# Run by the DBOS virtualenv's Python: argv = dsn, steps, sessions; prints JSON.
DBOS_PROGRAM = f"""
import json, sys, threading, time
from importlib.metadata import version
from dbos import DBOS

dsn, steps, sessions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
DBOS(config={{"name": "bench", "system_database_url": dsn, "run_admin_server": False}})

def filler(chars, tag):
    unit = f"{{tag}}: lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    return (unit * (chars // len(unit) + 1))[:chars]

@DBOS.step()
def record(item: str) -> str:
    return filler({RESULT_CHARS}, "recorded " + item[:12])

@DBOS.workflow()
def backlog(session: int, steps: int) -> int:
    done = 0
    for step in range(steps):
        record(filler({ARGUMENT_CHARS}, f"item {{session}}.{{step}}"))
        done += 1
    return done

DBOS.launch()
backlog(-1, 5)  # warm up: connections, the tables
results = [0] * sessions
def one(n):
    results[n] = backlog(n, steps)
threads = [threading.Thread(target=one, args=(n,)) for n in range(sessions)]
start = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
seconds = time.perf_counter() - start
assert results == [steps] * sessions, results
DBOS.destroy()
print(json.dumps({{"seconds": seconds, "version": version("dbos")}}))
"""


def dbos_python() -> Path:
    """The DBOS virtualenv's python, made and filled on first use."""
    python = DBOS_VENV / "bin" / "python"
    if not python.exists():
        print(f"installing {DBOS_REQUIREMENT} into {DBOS_VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(DBOS_VENV)], check=True)
    probe = subprocess.run([str(python), "-c", "import dbos"], capture_output=True, check=False)
    if probe.returncode != 0:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", DBOS_REQUIREMENT], check=True
        )
    return python


def create_database(server: LocalPostgres, name: str) -> str:
    import psycopg

    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.dsn(name)


async def floor(dsn: str, steps: int, sessions: int) -> float:
    """Seconds for `sessions` connections each making `steps` x two bare commits."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS floor (session INT, seq INT, body TEXT, "
            "PRIMARY KEY (session, seq))"
        )
        await conn.execute("TRUNCATE floor")
    call, result = filler(ARGUMENT_CHARS, "call"), filler(RESULT_CHARS, "result")

    async def one(session: int) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            insert = "INSERT INTO floor VALUES (%s, %s, %s)"
            for step in range(steps):
                await conn.execute(insert, (session, 2 * step, call), prepare=True)
                await conn.execute(insert, (session, 2 * step + 1, result), prepare=True)

    start = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(sessions)))
    return time.perf_counter() - start


async def kit(dsn: str, steps: int, sessions: int, tag: str) -> float:
    """Seconds for `sessions` concurrent `run()` turns of `steps` tool steps each."""
    async with postgres_store(dsn, max_connections=max(sessions, 2)) as store:
        warm = await run(make_agent(5), llm=InstantLLM(5), message=USER_MESSAGE,
                         session_id=f"warm-{tag}", store=store)  # fmt: skip
        if warm.status != "complete":
            raise RuntimeError(f"the warm-up run failed: {warm.error}")

        async def one(n: int) -> None:
            result = await run(
                make_agent(steps), llm=InstantLLM(steps), message=USER_MESSAGE,
                session_id=f"{tag}-{n}", store=store,
            )  # fmt: skip
            if result.status != "complete" or len(result.messages) != 2 * steps + 3:
                raise RuntimeError(f"unexpected run: {result.status}, {result.error}")

        start = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(sessions)))
        return time.perf_counter() - start


def dbos(python: Path, dsn: str, steps: int, sessions: int) -> tuple[float, str]:
    done = subprocess.run(
        [str(python), "-c", DBOS_PROGRAM, dsn, str(steps), str(sessions)],
        capture_output=True, text=True, check=False, cwd=DBOS_VENV,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the DBOS run failed:\n{done.stderr[-3000:]}")
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return float(measured["seconds"]), str(measured["version"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="tool steps per session (200)")
    parser.add_argument("--sessions", default="1,4,16", help="sessions at once (1,4,16)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, median (3)")
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS out")
    args = parser.parse_args()
    counts = [int(n) for n in args.sessions.split(",")]
    python = None if args.no_dbos else dbos_python()
    server = LocalPostgres(durable=True, tag="bench-").start()
    try:
        kit_dsn = create_database(server, "kit")
        floor_dsn = create_database(server, "floor")
        dbos_url = server.dsn("dbos_sys").replace("postgresql://", "postgresql+psycopg://")
        rows = []
        dbos_version = ""
        for index, sessions in enumerate(counts):
            total = args.steps * sessions
            runs: list[tuple[float, float, float | None]] = []
            for repeat in range(args.repeats):  # interleaved: the machine's load hits all three
                floor_s = asyncio.run(floor(floor_dsn, args.steps, sessions))
                tag = f"r{index}.{repeat}"
                kit_s = asyncio.run(kit(kit_dsn, args.steps, sessions, tag))
                dbos_s = None
                if python is not None:
                    dbos_s, dbos_version = dbos(python, dbos_url, args.steps, sessions)
                runs.append((floor_s, kit_s, dbos_s))
            floor_s, kit_s = (statistics.median(r[i] for r in runs) for i in (0, 1))
            dbos_s = statistics.median(r[2] for r in runs if r[2]) if python is not None else None
            rows.append((sessions, total, floor_s, kit_s, dbos_s))
        print(
            f"\nPostgreSQL {server_version(server)} on a Unix socket, fsync on, "
            f"synchronous_commit=on; {args.steps} steps per session"
            + (f"; DBOS {dbos_version}" if python is not None else "")
        )
        print(
            f"{'sessions':>8} | {'floor steps/s':>13} {'kit steps/s':>11} {'DBOS steps/s':>12} | "
            f"{'floor ms':>8} {'kit ms':>7} {'DBOS ms':>7} | {'kit/floor':>9} {'kit/DBOS':>8}"
        )
        for sessions, total, floor_s, kit_s, dbos_s in rows:
            # ms per step of one session (its wall time / its steps); steps/s of all.
            per = [s * 1000 / (total / sessions) if s else 0.0 for s in (floor_s, kit_s, dbos_s)]
            dbos_rate = f"{total / dbos_s:12.0f}" if dbos_s else f"{'-':>12}"
            vs_dbos = f"{kit_s / dbos_s:8.2f}x" if dbos_s else f"{'-':>9}"
            print(
                f"{sessions:>8} | {total / floor_s:13.0f} {total / kit_s:11.0f} {dbos_rate} | "
                f"{per[0]:8.2f} {per[1]:7.2f} {per[2]:7.2f} | {kit_s / floor_s:8.2f}x {vs_dbos}"
            )
        print("kit/floor, kit/DBOS: the kit's time per step as a ratio (below 1: faster)")
    finally:
        server.stop()


def server_version(server: LocalPostgres) -> str:
    import psycopg

    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


if __name__ == "__main__":
    main()
