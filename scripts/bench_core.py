#!/usr/bin/env python3
"""Benchmark of the durable core: what durability costs, and how it compares.

    .venv/bin/python scripts/bench_core.py            # full run (under a minute)
    .venv/bin/python scripts/bench_core.py --quick    # smoke run for CI (< 60 s)
    .venv/bin/python scripts/bench_core.py --dir /mnt/disk   # DB files there
    .venv/bin/python scripts/bench_core.py --section 6  # issue 33's ratios only
    .venv/bin/python scripts/bench_core.py --section 6 --against main  # and against main

The workload is one long scripted turn: every step the "LLM" (an object that
answers instantly) asks for one tool call whose argument is a 200-character
string, the tool answers with a 300-character string, and after the last step
the LLM gives a short final reply. Content is deterministic; nothing is random.
It measures, in one run:

1. Throughput. steps/s of `run()` on `sqlite_store(file)` with a session_id
   (durable) against `memory_store()` without one (no durability at all), and
   the commits per step (atomic appends, counted by wrapping the store). The
   gap between the two is the price of durability.
2. Storage growth. DB bytes after 50, 100, 200 and 400 steps, each measured
   after the store is closed and the WAL is checkpointed into the main file.
   Bytes per step should be the same in every interval: each step appends its
   two messages and never rewrites earlier history.
3. Resume. `run(..., message=None)` on a stored session of 100, 1,000 and
   10,000 messages, from a fresh store (connect + load included), median of
   several repetitions: once on a finished turn (load, return the stored
   reply, no LLM call) and once on a turn that crashed after storing a tool
   call (load, store a result for the orphan, one LLM call, final write).
4. The floor. Median latency of a small `os.write` + `os.fsync` in the same
   directory, and of a bare one-row SQLite commit. A durable step commits
   twice, so about 2 x fsync is the least a step can cost on this disk; the
   ratios show how close the loop gets.
5. LangGraph. The same workload (same messages, sizes and step count) as a
   `StateGraph` with an "llm" node and a "tools" node, checkpointed by
   `langgraph-checkpoint-sqlite`'s `SqliteSaver` to a file with
   `durability="sync"` (each checkpoint is committed before the next step
   starts), run with LangGraph's usual `add_messages` state and with its beta
   `DeltaChannel` (if the installed version has it). Prints time and bytes
   per step, and the ratios ours/LangGraph (below 1 means ours is faster or
   smaller). Skipped if the `bench` extra is not installed
   (`pip install -e '.[bench]'`).
6. Flat steps (issue 33): five ratios, each printed beside its target, each
   side measured alternately with its baseline in this run (medians): the
   in-memory step against the same at 8e1f135 (or each `--against REV`: its
   `src/` from `git archive`, the workload of `bench_workload.py` run in
   processes of this tree's kit and of REV's in turn, CPU time); an
   in-memory step in the last quarter of a 200-step turn against one in its
   first quarter (and the absolute time per step); a session's 6th 60-step
   turn against its 1st (in memory, the memory store taken as durable so one
   session has turns: the CPU; and on a SQLite file); a durable SQLite step
   (write #1, the handler, write #2) against two bare SQLite commits of the
   same rows with the store's own file settings (WAL, synchronous=FULL), with
   the store's part of it (its two appends alone, no run loop); and loading
   10,000 stored messages against a bare SELECT of those rows with
   `json.loads` of their tool calls. A ratio over its target says so. What
   runs on the CPU alone is timed in CPU time (`time.thread_time`), the rest
   by the wall clock.

Timings are wall-clock on whatever machine runs this: compare numbers from
the same run only. Nothing here asserts on timing; the few checks make sure
both sides really did the same work.
"""

import argparse
import asyncio
import gc
import importlib
import io
import itertools
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench_workload import (  # a sibling script: the workload, also run on an old kit
    ARGUMENT_CHARS,
    FINAL_REPLY,
    FLAT_STEPS,
    RESULT_CHARS,
    TOOL_NAME,
    USER_MESSAGE,
    InstantLLM,
    call_id,
    make_agent,
    tool_arguments,
    tool_result,
)

from durable_agents import Agent, Message, Store, ToolCall, run
from durable_agents.stores import Lease, MemoryStore, memory_store, sqlite_store
from durable_agents.stores._call_thread import CallThread
from durable_agents.testing import count_writes


@dataclass(frozen=True)
class Config:
    steps: int  # tool-call steps of the long session (sections 1 and 5)
    repeats: int  # repetitions of sections 1 and 5 (median reported)
    growth_steps: tuple[int, ...]  # section 2
    resume_sizes: tuple[int, ...]  # section 3, in messages
    resume_repeats: int
    fsync_samples: int
    flat_repeats: int  # section 6


FULL = Config(200, 3, (50, 100, 200, 400), (100, 1_000, 10_000), 7, 200, 7)
QUICK = Config(50, 1, (25, 50, 100), (100, 1_000, 10_000), 3, 50, 3)


# -- small helpers ----------------------------------------------------------


def header(title: str) -> None:
    print(f"\n== {title} ==")


def line(label: str, value: str) -> None:
    print(f"  {label:<40} {value}")


def table(rows: Sequence[Sequence[str]], first: int = 34, width: int = 18) -> None:
    """Rows of cells: a left-aligned label, then right-aligned values."""
    for label, *cells in rows:
        print(f"  {label:<{first}}" + "".join(f"{cell:>{width}}" for cell in cells))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.3f}"


def step_durations(stamps: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(stamps)]


def quarter_medians(durations: Sequence[float]) -> tuple[float, float]:
    """Median step time of the first and of the last quarter of the session."""
    quarter = max(1, len(durations) // 4)
    return statistics.median(durations[:quarter]), statistics.median(durations[-quarter:])


def checkpointed_size(path: Path) -> int:
    """Bytes of the DB file once the WAL is folded into it (no connection may be open)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def query_one(path: Path, sql: str) -> tuple[Any, ...]:
    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute(sql).fetchone())
    finally:
        conn.close()


# -- 1. throughput ----------------------------------------------------------


@dataclass
class SessionRun:
    seconds: float
    commits: int
    durations: list[float]

    def per_step(self, steps: int) -> float:
        return self.seconds / steps


async def run_session(store: Store, steps: int, session_id: str | None) -> SessionRun:
    counting = count_writes(store)
    llm = InstantLLM(steps)
    gc.collect()
    start = time.perf_counter()
    result = await run(
        make_agent(steps), llm=llm, message=USER_MESSAGE, session_id=session_id, store=counting
    )
    seconds = time.perf_counter() - start
    expected = steps * 2 + 3  # system, user, (call, result) per step, final reply
    if result.status != "complete" or len(result.messages) != expected:
        raise RuntimeError(f"unexpected run: {result.status}, {len(result.messages)} messages")
    return SessionRun(seconds, counting.appends, step_durations(llm.stamps)[:steps])


async def durable_session(path: Path, steps: int) -> SessionRun:
    store = sqlite_store(path)
    try:
        return await run_session(store, steps, "bench")
    finally:
        await store.close()


def session_rows(runs: list[SessionRun], steps: int) -> list[str]:
    """One column of section 1's table (medians over repetitions)."""
    per_step = statistics.median(r.per_step(steps) for r in runs)
    first, last = quarter_medians(runs[0].durations)
    commits = runs[0].commits
    return [
        f"{1 / per_step:,.0f}",
        ms(per_step),
        f"{commits}",
        f"{(commits - 1) / steps:.2f}",
        ms(first),
        ms(last),
    ]


async def section_throughput(config: Config, workdir: Path) -> tuple[float, SessionRun]:
    steps = config.steps
    header(f"1. Throughput: {steps} steps of one tool call, then a final reply")
    line("content per step", f"{ARGUMENT_CHARS}-char argument, {RESULT_CHARS}-char result")
    line("repetitions", f"{config.repeats} (median of the whole run's time)")
    durable, memory = [], []
    for repeat in range(config.repeats):
        durable.append(await durable_session(workdir / f"throughput-{repeat}.db", steps))
        memory.append(await run_session(memory_store(), steps, None))
    labels = [
        "steps/s",
        "time per step",
        "commits (whole turn)",
        "commits per tool step",
        "median step, first quarter",
        "median step, last quarter",
    ]
    columns = zip(labels, session_rows(durable, steps), session_rows(memory, steps), strict=True)
    table([("", "durable sqlite", "memory"), *columns])
    print("  durable: sqlite_store(file) + session_id; memory: memory_store(), no session_id;")
    print("  commits = atomic appends (write #1 and #2 per step, + the final reply)")
    durable_step = statistics.median(r.per_step(steps) for r in durable)
    memory_step = statistics.median(r.per_step(steps) for r in memory)
    line("durable / memory, time per step", f"{durable_step / memory_step:.1f}x")
    return durable_step, durable[0]


# -- 2. storage growth ------------------------------------------------------


async def section_growth(config: Config, workdir: Path) -> None:
    header("2. Storage growth: DB bytes after N steps (store closed, WAL checkpointed)")
    sizes = {}
    for steps in config.growth_steps:
        path = workdir / f"growth-{steps}.db"
        await durable_session(path, steps)
        sizes[steps] = checkpointed_size(path)
    rows = [("steps", "DB bytes", "bytes per step", "since previous")]
    previous = None
    for steps, size in sizes.items():
        interval = (
            "-" if previous is None else f"{(size - sizes[previous]) / (steps - previous):,.0f}"
        )
        rows.append((f"{steps}", f"{size:,}", f"{size / steps:,.0f}", interval))
        previous = steps
    table(rows, first=8, width=16)
    fit = statistics.linear_regression(list(sizes), list(sizes.values()))
    worst = max(abs(size - (fit.intercept + fit.slope * n)) / size for n, size in sizes.items())
    line("least-squares fit", f"{fit.intercept:,.0f} B + {fit.slope:,.0f} B x steps")
    line("largest deviation from the fit", f"{worst:.1%}")
    last_db = workdir / f"growth-{config.growth_steps[-1]}.db"
    (content,) = query_one(
        last_db, "SELECT SUM(LENGTH(content) + COALESCE(LENGTH(tool_calls), 0)) FROM agent_messages"
    )
    (free_pages,) = query_one(last_db, "PRAGMA freelist_count")
    line("message text stored per step", f"{content / config.growth_steps[-1]:,.0f} B")
    line("free pages in the largest DB", f"{free_pages} (no page was freed)")
    print("  bytes/step stays about the same between sizes: growth is linear, a step appends")
    print("  2 rows and rewrites nothing (sizes move in whole 4,096-byte pages, and B-tree")
    print("  page splits leave pages part-full, so intervals wobble around the slope)")


# -- 3. resume --------------------------------------------------------------


def stored_history(messages: int, ending: str) -> list[Message]:
    """`messages` messages: a user message, (call, result) pairs, and a last
    message that is a final reply ("final") or a call never answered ("orphan")."""
    pairs = (messages - 2) // 2
    history = [Message.user(USER_MESSAGE)]
    for step in range(1, pairs + 1):
        call = ToolCall(call_id(step), TOOL_NAME, tool_arguments(step))
        history.append(Message.assistant(tool_calls=[call]))
        history.append(Message.tool_result(call, tool_result(call.id)))
    if ending == "final":
        history.append(Message.assistant(FINAL_REPLY))
    else:
        orphan = ToolCall(call_id(pairs + 1), TOOL_NAME, tool_arguments(pairs + 1))
        history.append(Message.assistant(tool_calls=[orphan]))
    return history


async def build_sessions(path: Path, sessions: dict[str, list[Message]]) -> None:
    """Writes the sessions through the store, 1,000 messages per append."""
    store = sqlite_store(path)
    try:
        for session_id, history in sessions.items():
            for start in range(0, len(history), 1_000):
                batch = history[start : start + 1_000]
                await store.append_messages_atomic(session_id, start, batch)
    finally:
        await store.close()


async def build_resume_sessions(path: Path, config: Config) -> None:
    """A finished session per size, and one crashed session per size and repetition
    (an orphan resume changes its session, so every repetition needs its own)."""
    sessions: dict[str, list[Message]] = {}
    for size in config.resume_sizes:
        sessions[f"final-{size}"] = stored_history(size, "final")
        for repeat in range(config.resume_repeats):
            sessions[f"orphan-{size}-{repeat}"] = stored_history(size, "orphan")
    await build_sessions(path, sessions)


async def timed_resume(path: Path, session_id: str, llm_calls: int) -> tuple[float, int]:
    """Seconds of one resume from a fresh store, and the commits it made."""
    store = sqlite_store(path)
    counting = count_writes(store)
    llm = InstantLLM(0)
    gc.collect()  # start every timing from the same heap
    try:
        start = time.perf_counter()
        result = await run(make_agent(1), llm=llm, session_id=session_id, store=counting)
        seconds = time.perf_counter() - start
    finally:
        await store.close()
    if result.status != "complete" or llm.calls != llm_calls:
        raise RuntimeError(f"unexpected resume of {session_id}: {result.status}, {llm.calls} calls")
    return seconds, counting.appends


async def timed_load(path: Path, session_id: str) -> float:
    store = sqlite_store(path)
    gc.collect()
    try:
        start = time.perf_counter()
        await store.load_messages(session_id)
        return time.perf_counter() - start
    finally:
        await store.close()


async def section_resume(config: Config, workdir: Path) -> None:
    header("3. Resume: run(..., message=None) from a fresh store (connect + load included)")
    repeats = config.resume_repeats
    line("repetitions", f"{repeats} (median; warm OS page cache)")
    path = workdir / "resume.db"
    await build_resume_sessions(path, config)
    rows = [("messages", "load only", "final reply", "orphan", "orphan commits")]
    for size in config.resume_sizes:
        load, final, orphan, commits = [], [], [], 0
        for repeat in range(repeats):
            load.append(await timed_load(path, f"final-{size}"))
            final.append((await timed_resume(path, f"final-{size}", 0))[0])
            seconds, commits = await timed_resume(path, f"orphan-{size}-{repeat}", 1)
            orphan.append(seconds)
        medians = [ms(statistics.median(times)) for times in (load, final, orphan)]
        rows.append((f"{size:,}", *medians, f"{commits}"))
    table(rows, first=10, width=15)
    print("  load only: store.load_messages() alone; final reply: the turn had finished")
    print("  (load + return, no LLM call, no write); orphan: the turn crashed after write #1")
    print("  (load + repair write + 1 LLM call + final write)")


# -- 4. the floor -----------------------------------------------------------


def sync_latency(path: Path, samples: int, sync: Callable[[int], None]) -> float:
    """Median time of appending 512 bytes to a file and syncing it."""
    block = b"x" * 512
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            os.write(fd, block)
            sync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
    return statistics.median(times)


def bare_commit_latency(path: Path, samples: int) -> float:
    """Median time of one bare SQLite transaction inserting a 500-byte row (WAL, FULL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (body) VALUES (?)", ("x" * 500,))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - start)
    finally:
        conn.close()
    return statistics.median(times)


def section_floor(config: Config, workdir: Path, durable_step: float) -> None:
    samples = config.fsync_samples
    header(f"4. The floor: this disk's sync latency (median of {samples}, same directory)")
    fsync = sync_latency(workdir / "fsync.bin", samples, os.fsync)
    fdatasync = sync_latency(workdir / "fdatasync.bin", samples, os.fdatasync)
    commit = bare_commit_latency(workdir / "bare.db", samples)
    line("os.write(512 B) + os.fsync", ms(fsync))
    line("os.write(512 B) + os.fdatasync", ms(fdatasync))
    line("bare SQLite commit (1 row, WAL, FULL)", ms(commit))
    line("durable step (section 1)", ms(durable_step))
    line("durable step / (2 x fsync)", f"{durable_step / (2 * fsync):.2f}x")
    line("durable step / (2 x bare SQLite commit)", f"{durable_step / (2 * commit):.2f}x")
    print("  a durable step commits twice, each commit syncing the WAL once, so 2 x fsync")
    print("  is the floor; the gap to it is SQLite's own work plus the loop's")


# -- 5. LangGraph -----------------------------------------------------------


@dataclass
class GraphRun:
    seconds: float
    durations: list[float]
    checkpoint_puts: int
    write_puts: int
    db_bytes: int
    checkpoint_rows: int
    checkpoint_bytes: int
    largest_checkpoint: int
    write_rows: int


def langgraph_available() -> bool:
    try:
        for module in ("langgraph.graph", "langgraph.checkpoint.sqlite"):
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def delta_channel_available() -> bool:
    return hasattr(importlib.import_module("langgraph.channels"), "DeltaChannel")


def messages_reducer(delta: bool) -> Any:
    """`add_messages`, or the same fold as a DeltaChannel (which hands it batches)."""
    from langgraph.graph.message import add_messages

    if not delta:
        return add_messages
    from langgraph.channels import DeltaChannel

    def add_message_batches(state: list[Any], batches: Sequence[Any]) -> list[Any]:
        for batch in batches:
            state = add_messages(state, batch)
        return state

    return DeltaChannel(add_message_batches)


def build_graph(steps: int, delta: bool, stamps: list[float]) -> Any:
    """The workload as a StateGraph: llm -> tools -> llm ... -> llm (final) -> END."""
    from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph

    reducer = messages_reducer(delta)

    class State(TypedDict):
        messages: Annotated[list[AnyMessage], reducer]

    def llm(state: State) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        step = len(stamps)
        if step > steps:
            return {"messages": [AIMessage(content=FINAL_REPLY)]}
        call = {"name": TOOL_NAME, "args": tool_arguments(step), "id": call_id(step)}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def tools(state: State) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]
        content = tool_result(call["id"])
        return {"messages": [ToolMessage(content=content, tool_call_id=call["id"], name=TOOL_NAME)]}

    def route(state: State) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    builder = StateGraph(State)
    builder.add_node("llm", llm)
    builder.add_node("tools", tools)
    builder.add_edge(START, "llm")
    builder.add_conditional_edges("llm", route, ["tools", END])
    builder.add_edge("tools", "llm")
    return builder


def counting_saver(conn: sqlite3.Connection) -> Any:
    """A SqliteSaver that counts its calls; each put and put_writes commits once."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    class CountingSaver(SqliteSaver):
        checkpoint_puts = 0
        write_puts = 0

        def put(self, *args: Any, **kwargs: Any) -> Any:
            self.checkpoint_puts += 1
            return super().put(*args, **kwargs)

        def put_writes(self, *args: Any, **kwargs: Any) -> None:
            self.write_puts += 1
            super().put_writes(*args, **kwargs)

    return CountingSaver(conn)


def run_graph(path: Path, steps: int, delta: bool) -> GraphRun:
    from langchain_core.messages import HumanMessage

    stamps: list[float] = []
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA synchronous = FULL")  # SQLite's default, as ours; made explicit
    saver = counting_saver(conn)
    graph = build_graph(steps, delta, stamps).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * steps + 10}
    gc.collect()
    try:
        start = time.perf_counter()
        out = graph.invoke({"messages": [HumanMessage(USER_MESSAGE)]}, config, durability="sync")
        seconds = time.perf_counter() - start
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    if len(out["messages"]) != 2 * steps + 2 or mode != "wal":
        raise RuntimeError(f"unexpected graph run: {len(out['messages'])} messages, {mode}")
    db_bytes = checkpointed_size(path)
    checkpoints = query_one(
        path, "SELECT COUNT(*), SUM(LENGTH(checkpoint)), MAX(LENGTH(checkpoint)) FROM checkpoints"
    )
    (write_rows,) = query_one(path, "SELECT COUNT(*) FROM writes")
    durations = step_durations(stamps)[:steps]
    puts = (saver.checkpoint_puts, saver.write_puts)
    return GraphRun(seconds, durations, *puts, db_bytes, *checkpoints, write_rows)


def graph_column(runs: list[GraphRun], steps: int) -> tuple[float, float, list[str]]:
    """Median seconds per step, bytes per step, and the column of section 5's table."""
    per_step = statistics.median(r.seconds for r in runs) / steps
    first, last = quarter_medians(runs[0].durations)
    r = runs[0]
    cells = [
        ms(per_step),
        f"{1 / per_step:,.0f}",
        ms(first),
        ms(last),
        f"{(r.checkpoint_puts + r.write_puts) / steps:.2f}",
        f"{r.checkpoint_puts} + {r.write_puts}",
        f"{r.checkpoint_rows} / {r.write_rows}",
        f"{r.checkpoint_bytes:,}",
        f"{r.largest_checkpoint:,}",
        f"{r.db_bytes:,}",
        f"{r.db_bytes / steps:,.0f}",
    ]
    return per_step, r.db_bytes / steps, cells


def print_persisted() -> None:
    print("  what is persisted per step (both: WAL, synchronous=FULL, file on the same disk):")
    print("    ours: write #1 = the AI message (1 row) + session row upsert, one commit; the")
    print("      handler runs; write #2 = the tool message (1 row) + upsert, one commit.")
    print("      Append-only: nothing earlier is rewritten. 2 commits per step.")
    print("    LangGraph: 2 supersteps per step (llm, tools); each commits the node's writes")
    print("      (put_writes) and then a checkpoint (put) that 'sync' waits for before the")
    print("      next superstep. With add_messages every checkpoint serializes the whole")
    print("      message list so far; with DeltaChannel (beta) a checkpoint holds a marker")
    print("      and the full list only every 100 updates (a snapshot).")


def section_langgraph(config: Config, workdir: Path, ours: tuple[float, int, SessionRun]) -> None:
    steps = config.steps
    header(f"5. LangGraph: StateGraph + SqliteSaver, durability='sync', {steps} steps")
    if not langgraph_available():
        print("  skipped: langgraph is not installed (pip install -e '.[bench]')")
        return
    versions = f"langgraph {version('langgraph')}, "
    versions += f"langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}"
    line("versions", f"{versions}, SQLite {sqlite3.sqlite_version}")
    line("repetitions", f"{config.repeats} (median of the whole run's time)")
    print_persisted()
    our_step, our_db, our_run = ours
    first, last = quarter_medians(our_run.durations)
    our_cells = [
        ms(our_step),
        f"{1 / our_step:,.0f}",
        ms(first),
        ms(last),
        f"{our_run.commits / steps:.2f}",
        f"{our_run.commits} appends",
        f"{2 * steps + 2} messages",
        "-",
        "-",
        f"{our_db:,}",
        f"{our_db / steps:,.0f}",
    ]
    columns = [our_cells]
    ratios = []
    variants = {"LG add_messages": False}
    if delta_channel_available():
        variants["LG DeltaChannel"] = True
    for delta in variants.values():
        runs = [
            run_graph(workdir / f"langgraph-{int(delta)}-{repeat}.db", steps, delta)
            for repeat in range(config.repeats)
        ]
        graph_step, graph_bytes, cells = graph_column(runs, steps)
        columns.append(cells)
        ratios.append((ratio(our_step, graph_step), ratio(our_db / steps, graph_bytes)))
    labels = [
        "time per step",
        "steps/s",
        "median step, first quarter",
        "median step, last quarter",
        "commits per step",
        "commits (checkpoints + writes)",
        "rows (checkpoints / writes)",
        "checkpoint blobs, bytes",
        "largest checkpoint blob, bytes",
        "DB bytes (WAL checkpointed)",
        "DB bytes per step",
    ]
    heads = ("", "ours (sqlite)", *variants)
    table([heads, *zip(labels, *columns, strict=True)], first=32, width=20)
    table(
        [
            ("ours / LangGraph, time per step", "", *(r[0] for r in ratios)),
            ("ours / LangGraph, bytes per step", "", *(r[1] for r in ratios)),
        ],
        first=32,
        width=20,
    )
    print("  ratios below 1: ours is faster / smaller. 'ours' is section 1's durable run")
    print("  (its first repetition's DB and step times).")


# -- 6. flat steps ----------------------------------------------------------

STEP_CHUNK = 50  # durable steps timed in a row, before the baselines' turn
TURNS, TURN_STEPS = 6, 60  # the session whose 6th turn is compared with its 1st
LOADED = 10_000  # the messages loaded
# What the store selects for a load (`load_messages`), written out: the bare baseline.
BARE_SELECT = (
    "SELECT role, content, tool_call_id, tool_name, tool_calls, input_tokens, output_tokens, "
    "request_key, summary_of, origin, instructions FROM agent_messages WHERE session_id = ? "
    "ORDER BY seq"
)
# sqlite_store's own file settings (SQLiteStore._connect), for the bare commits.
STORE_PRAGMAS = (
    "PRAGMA busy_timeout = 10000",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",
)


class KeptMemoryStore(MemoryStore):
    """The memory store taken as durable, so one session can have turns: what a turn
    costs the CPU, without a disk (a real session's store loads its messages anew)."""

    durable = True


@dataclass(frozen=True)
class Ratio:
    """One line of section 6: ours against its baseline, at most `target` times it."""

    label: str
    ours: float  # seconds
    baseline: float
    target: float | None = None  # None: a part of the line above, to tell where time goes

    def cells(self) -> list[str]:
        value = self.ours / self.baseline
        cells = [ms(self.ours), ms(self.baseline), f"{value:.2f}x"]
        if self.target is None:
            return cells
        return [*cells, f"<= {self.target}x", "met" if value <= self.target else "MISSED"]


async def timed_turn(
    store: Store,
    agent: Agent,
    steps: int,
    session_id: str | None = None,
    turn: str = "",
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, list[float]]:
    """Seconds of one turn of `steps` tool steps (no wrapper around the store), and each
    step's duration, by `clock` (the wall clock, or the CPU's `time.thread_time`)."""
    llm = InstantLLM(steps, turn, clock)
    gc.collect()
    start = clock()
    result = await run(agent, llm=llm, message=USER_MESSAGE, session_id=session_id, store=store)
    seconds = clock() - start
    if result.status != "complete" or llm.calls != steps + 1:
        raise RuntimeError(f"unexpected turn: {result.status} {result.error}, {llm.calls} calls")
    return seconds, step_durations(llm.stamps)[:steps]


TREE = Path(__file__).resolve().parents[1]  # this checkout
WORKLOAD = Path(__file__).resolve().with_name("bench_workload.py")
AGAINST = "8e1f135"  # issue 33: an in-memory step no slower than at this commit


def export_src(rev: str, into: Path) -> Path:
    """`src/` as it was at `rev` (`git archive`), under `into`: its path."""
    tar = subprocess.run(
        ["git", "-C", str(TREE), "archive", "--format=tar", rev, "src"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return into / "src"


def workload_turns(src: Path, turns: int) -> list[float]:
    """CPU seconds per step of `turns` in-memory turns (`bench_workload.py`) in a new
    process, with the kit of `src` first on its path (checked: imported from there)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(src), str(WORKLOAD.parent)))}
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(turns)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    if not Path(report["kit"]).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"the kit came from {report['kit']}, not {src}")
    return [float(seconds) for seconds in report["per_step"]]


def against_ratios(repeats: int, revs: Sequence[str], workdir: Path) -> list[Ratio]:
    """The in-memory step of this tree against the same at each of `revs`: `repeats`
    rounds, each a process of 3 turns of this tree's kit, then one of each rev's (the
    same workload, `bench_workload.py`, run by all), medians of every turn's CPU per step.
    A rev that `git archive` cannot give (no git, a shallow clone) is left out, saying so."""
    trees = {}
    for rev in revs:
        try:
            trees[rev] = export_src(rev, workdir / f"at-{rev}")
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"  (no ratio against {rev}: git archive failed: {exc})")
    now: list[float] = []
    then: dict[str, list[float]] = {rev: [] for rev in trees}
    for _ in range(repeats if trees else 0):
        now += workload_turns(TREE / "src", 3)
        for rev, src in trees.items():
            then[rev] += workload_turns(src, 3)
    return [
        Ratio(
            f"memory step (CPU) now / at {rev}", statistics.median(now), statistics.median(t), 1.0
        )
        for rev, t in then.items()
    ]


async def quarter_steps(repeats: int) -> tuple[Ratio, float]:
    """The in-memory 200-step turn: its last quarter's median step against its first's
    (medians over the repetitions), and its median time per step. CPU time: nothing
    waits in it, and the machine's other load does not count."""
    firsts, lasts, per_step = [], [], []
    agent = make_agent(FLAT_STEPS)
    for _ in range(repeats):
        seconds, durations = await timed_turn(
            memory_store(), agent, FLAT_STEPS, clock=time.thread_time
        )
        first, last = quarter_medians(durations)
        firsts.append(first)
        lasts.append(last)
        per_step.append(seconds / FLAT_STEPS)
    label = f"memory step (CPU), last / first quarter of {FLAT_STEPS}"
    ratio = Ratio(label, statistics.median(lasts), statistics.median(firsts), 1.3)
    return ratio, statistics.median(per_step)


async def session_turns(
    store: Store, agent: Agent, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Seconds of each of TURNS turns on one new session of `store`, after a turn on a
    session of its own: what a first turn pays once (a file's connection and schema, its
    WAL grown to size, the agent's first run) is no turn's cost of history."""
    await timed_turn(store, agent, TURN_STEPS, "warm-up")
    return [
        (await timed_turn(store, agent, TURN_STEPS, "turns", f"t{turn}-", clock))[0]
        for turn in range(TURNS)
    ]


async def turn_ratios(repeats: int, workdir: Path) -> list[Ratio]:
    """The 6th turn against the 1st, in memory and on a SQLite file, alternately. No
    compaction is due (max_context_tokens far above what they hold): every turn sends
    its whole history."""
    agent = make_agent(TURN_STEPS, max_context_tokens=1_000_000)
    memory, disk = [], []
    for repeat in range(repeats):
        memory.append(await session_turns(KeptMemoryStore(), agent, time.thread_time))
        store = sqlite_store(workdir / f"turns-{repeat}.db")
        try:
            disk.append(await session_turns(store, agent))
        finally:
            await store.close()
    ratios = []
    for where, runs in (("memory as durable, CPU", memory), ("sqlite file", disk)):
        last, first = (statistics.median(r[i] for r in runs) for i in (TURNS - 1, 0))
        label = f"{TURNS}th / 1st {TURN_STEPS}-step turn, {where}"
        ratios.append(Ratio(label, last, first, 1.3))
    return ratios


# The bare commits' table: agent_messages' columns without its keys, indexes and
# triggers, so each bare commit writes the bytes of the row the store writes.
BARE_TABLE = (
    "CREATE TABLE t (session_id TEXT, seq INTEGER, role TEXT, content TEXT, "
    "tool_call_id TEXT, tool_name TEXT, tool_calls TEXT, input_tokens INTEGER, "
    "output_tokens INTEGER, request_key TEXT, summary_of INTEGER, origin TEXT, "
    "instructions TEXT, created_at INTEGER)"
)
BARE_INSERT = "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def bare_step_rows(step: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The two message rows the store writes for tool step `step` (the call, then its
    result), column by column, the calls as the store encodes them (compact JSON)."""
    call = ToolCall(call_id(step), TOOL_NAME, tool_arguments(step))
    calls = json.dumps([call.to_dict()], separators=(",", ":"), ensure_ascii=False)
    now = int(time.time() * 1000)
    empty = (None,) * 6  # the usage, request key, summary, origin and instructions
    return (
        ("bare", 2 * step - 1, "assistant", "", None, None, calls, *empty, now),
        ("bare", 2 * step, "tool", tool_result(call.id), call.id, TOOL_NAME, None, *empty, now),
    )


def bare_step_commits(conn: sqlite3.Connection, first: int, steps: int) -> list[float]:
    """Seconds of each of `steps` pairs of bare SQLite commits into table `t`, each
    inserting one row of what a step stores (the call's row, then the result's)."""
    times = []
    for step in range(first, first + steps):
        rows = bare_step_rows(step)
        start = time.perf_counter()
        for row in rows:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(BARE_INSERT, row)
            conn.execute("COMMIT")
        times.append(time.perf_counter() - start)
    return times


def bare_database(path: Path) -> sqlite3.Connection:
    """A connection with the store's file settings to a file with one table, `t`."""
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in STORE_PRAGMAS:
        conn.execute(pragma)
    conn.execute(BARE_TABLE)
    return conn


async def step_appends(store: Store, session_id: str, steps: int) -> list[float]:
    """Seconds of each of `steps` pairs of appends of what a step stores to a new session
    (the call, then its result, each renewing the run's lease as a run's do), no run loop."""
    lease = Lease("bench", 30_000)
    await store.acquire_lease(session_id, lease.owner, lease.ttl_ms)
    await store.append_messages_atomic(session_id, 0, [Message.user(USER_MESSAGE)], lease=lease)
    times = []
    for step in range(1, steps + 1):
        call = ToolCall(call_id(step), TOOL_NAME, tool_arguments(step))
        pair = (
            Message.assistant(tool_calls=[call]),
            Message.tool_result(call, tool_result(call.id)),
        )
        start = time.perf_counter()
        for offset, message in enumerate(pair):
            position = 2 * step - 1 + offset
            await store.append_messages_atomic(session_id, position, [message], lease=lease)
        times.append(time.perf_counter() - start)
    return times


async def durable_step_ratios(repeats: int, workdir: Path) -> list[Ratio]:
    """A durable step against two bare commits, and, to tell the run loop's part from the
    store's, against two sqlite_store appends of the same rows without a run loop: runs of
    STEP_CHUNK steps of each in turn (a disk's latency drifts: each side sees the same
    stretch of it), medians over every step. Each file is opened (its schema made) first."""
    ours: list[float] = []
    appends: list[float] = []
    bare: list[float] = []
    agent = make_agent(STEP_CHUNK)
    turns, loose = sqlite_store(workdir / "steps.db"), sqlite_store(workdir / "appends.db")
    conn = bare_database(workdir / "bare-steps.db")
    try:
        for store in (turns, loose):
            await store.get_session("bench")  # connected, schema made: no step's cost
        for chunk in range(repeats * 4):
            ours += (await timed_turn(turns, agent, STEP_CHUNK, f"turn-{chunk}"))[1]
            appends += await step_appends(loose, f"appends-{chunk}", STEP_CHUNK)
            bare += bare_step_commits(conn, chunk * STEP_CHUNK + 1, STEP_CHUNK)
    finally:
        conn.close()
        await turns.close()
        await loose.close()
    step, commits = statistics.median(ours), statistics.median(bare)
    return [
        Ratio("durable sqlite step / 2 bare commits", step, commits, 1.5),
        Ratio("  its 2 store appends / 2 bare commits", statistics.median(appends), commits),
    ]


def bare_load(conn: sqlite3.Connection, session_id: str) -> tuple[list[Any], list[Any]]:
    """The rows of a session, and its tool calls parsed: the least a load does."""
    rows = conn.execute(BARE_SELECT, (session_id,)).fetchall()
    return rows, [json.loads(row[4]) for row in rows if row[4]]


async def load_ratio(repeats: int, workdir: Path) -> Ratio:
    """`load_messages` of LOADED messages against the bare SELECT with json.loads of the
    tool calls, alternately, both on an open connection to the same file."""
    path = workdir / "load.db"
    await build_sessions(path, {"load": stored_history(LOADED, "final")})
    store = sqlite_store(path)
    conn = sqlite3.connect(path)
    ours, bare = [], []
    try:
        await store.load_messages("load")  # connected
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            loaded = await store.load_messages("load")
            ours.append(time.perf_counter() - start)
            gc.collect()
            start = time.perf_counter()
            rows, _ = bare_load(conn, "load")
            bare.append(time.perf_counter() - start)
            if len(loaded) != LOADED or len(rows) != LOADED:
                raise RuntimeError(f"loaded {len(loaded)} messages and {len(rows)} rows")
            del loaded, rows  # not alive (for the collector to look at) in the next load
    finally:
        conn.close()
        await store.close()
    label = f"load {LOADED:,} messages / bare SELECT + json.loads"
    return Ratio(label, statistics.median(ours), statistics.median(bare), 2.0)


async def thread_round_trips(samples: int) -> tuple[float, float]:
    """Medians of one round trip to a thread and back (no work), through sqlite_store's
    own thread (CallThread: what it adds to each of its calls) and through
    `run_in_executor` on a one-thread pool (what it used instead), taking turns."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1)
    thread = CallThread("bench")
    ours, pooled = [], []
    try:
        for _ in range(samples):
            start = time.perf_counter()
            await thread.call(int, 0)
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            await loop.run_in_executor(executor, int)
            pooled.append(time.perf_counter() - start)
    finally:
        thread.stop()
        executor.shutdown()
    return statistics.median(ours), statistics.median(pooled)


async def section_flat(config: Config, workdir: Path, against: Sequence[str]) -> None:
    repeats = config.flat_repeats
    header(f"6. Flat steps: ratios against their targets (alternating, medians of {repeats})")
    quarters, per_step = await quarter_steps(repeats)
    ratios = [
        *against_ratios(repeats, against, workdir),
        quarters,
        *await turn_ratios(repeats, workdir),
        *await durable_step_ratios(repeats, workdir),
        await load_ratio(repeats, workdir),
    ]
    heads = ("", "ours", "baseline", "ratio", "target", "")
    table([heads, *((r.label, *r.cells()) for r in ratios)], first=46, width=11)
    hop, pooled = await thread_round_trips(200)
    table(
        [
            ("memory step, whole turn (CPU, absolute)", ms(per_step)),
            ("thread round trip, no work (2 a durable step)", ms(hop)),
            ("  the same by run_in_executor, for comparison", ms(pooled)),
        ],
        first=46,
        width=11,
    )
    print("  memory step: memory_store(), no session; the median step of a quarter of the")
    print(f"  turn, in CPU time (time.thread_time), as the memory turns. turns: {TURN_STEPS} steps")
    print("  each on one session, no compaction due; 'memory as durable' keeps the messages as")
    print("  objects (each turn measures the loaded history once), the sqlite file loads them")
    print("  each turn. durable step: from one LLM call to the next (write #1, the handler,")
    print(f"  write #2), median, in runs of {STEP_CHUNK} steps taking turns with the baselines'")
    print("  runs; bare: the same two message rows (agent_messages' columns, no index), a")
    print("  commit each, journal_mode=WAL and synchronous=FULL; sqlite_store runs each")
    print("  commit in its thread (the round trip above, twice a step). load: load_messages()")
    print("  on an open store against its SELECT and json.loads of the tool calls, on an")
    print("  open connection.")


# -- main -------------------------------------------------------------------


async def core_sections(config: Config, workdir: Path) -> tuple[float, int, SessionRun]:
    """Sections 1-3; returns section 1's durable time per step, DB bytes and first run."""
    durable_step, durable_run = await section_throughput(config, workdir)
    db_bytes = checkpointed_size(workdir / "throughput-0.db")
    await section_growth(config, workdir)
    await section_resume(config, workdir)
    return durable_step, db_bytes, durable_run


def default_dir() -> Path | None:
    """The repo's parent, so the DB files sit on the same disk as the checkout (None:
    the system temp dir, when the parent is not writable)."""
    parent = Path(__file__).resolve().parents[2]
    return parent if os.access(parent, os.W_OK) else None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark of the durable core.")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument(
        "--dir",
        type=Path,
        default=default_dir(),
        help="where the temporary directory for DB files is made (default: the repo's parent)",
    )
    parser.add_argument(
        "--section",
        type=int,
        choices=(6,),
        help="run only this section (6: issue 33's ratios; 4 and 5 need section 1's run)",
    )
    parser.add_argument(
        "--against",
        action="append",
        metavar="REV",
        help=f"section 6: the in-memory step against the kit at REV (a git revision; "
        f"repeatable; default {AGAINST}, issue 33's; '' for none)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="bench_core-", dir=args.dir))
    print(f"bench_core ({'quick' if args.quick else 'full'} run), DB files in {workdir}")
    print(
        f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs"
    )
    against = [AGAINST] if args.against is None else [rev for rev in args.against if rev]
    started = time.perf_counter()
    try:
        if args.section is None:
            ours = asyncio.run(core_sections(config, workdir))
            section_floor(config, workdir, ours[0])
            section_langgraph(config, workdir, ours)
        asyncio.run(section_flat(config, workdir, against))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ndone in {time.perf_counter() - started:.1f} s; {workdir} removed")


if __name__ == "__main__":
    main()
