#!/usr/bin/env python3
"""Benchmark: a turn on a 20,000-message session vs a turn on a fresh one, both stores.

    .venv/bin/python scripts/bench_long_session.py [--turns 20] [--warmup 3] [--messages 20000]

Issue 20: a turn loads what it needs (the latest summary, the messages after it),
not the whole history, so its cost does not grow with the session. Per store
(`SESSION_STORE=d1`, then `durable-object`; one `scripts/dev` each, on real
workerd, fresh state), in one run:

- a session is made by one real turn, then grown past `--messages` messages
  (a realistic mix: user questions, assistant steps with tool calls, tool
  results, replies; ~140 bytes a message, ~2.8 MB in all) written straight
  into the store's SQLite file (D1's under v3/d1, the session object's under
  v3/do) with the kit's own `SQLiteStore.append_messages_atomic` (the same
  statements the Worker runs, the append trigger checking every row), while
  the server runs: workerd keeps both files in WAL mode, so it reads the rows
  (scripts/bench_stores.py grows its sessions so too);
- the first turn on it, timed apart: it loads the whole history once and
  compacts (the summary LLM calls, counted, happen there);
- `--turns` turns on it and as many on a fresh session (made at the start,
  so both sessions' objects are warm), interleaved;
- per turn: median and p90 ms, their ratio, and the bytes of the model request
  (the turn's last LLM call, the largest: recorded by the fake model);
- memory: VmRSS of the workerd process running the Worker (its isolate, its
  Durable Objects, the local D1; wrangler dev runs a second, smaller one),
  read from /proc/<pid>/status after a first turn, before and after the first
  long turn, at the end (with VmHWM, its peak since start), plus its peak
  sampled every 20 ms during the first long turn; and the size
  of the Python isolate's wasm heap (Pyodide's linear memory, which only
  grows), reported by the turn's own tool.

The agent (`AGENT`, written to the state dir) has one tool, run inside the
Worker; the model is a fake on 127.0.0.1 (`FakeModel`): a turn is the user's
question, a `lookup` call, its result and the answer (2 LLM calls, 3 appends);
a request without tools (the kit's default summarizer) gets a short summary.
Needs the project's .venv (it imports the kit to seed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dev_process import PROJECT, DevServer  # a sibling script

sys.path.insert(0, str(PROJECT / "src"))
from durable_agents import Message, ToolCall
from durable_agents.stores.sqlite import SQLiteStore

TOKEN = "dev-token"
INSTRUCTIONS = "Answer the user's questions; look facts up with the lookup tool."
AGENT = f'''"""A long-session agent: one tool, answered inside the Worker."""

from pydantic import BaseModel

from durable_agents import Agent, tool

FACT = "recorded in the knowledge base, checked against two sources, " * 3


class Query(BaseModel):
    q: str


def heap_bytes():
    """The size of this isolate's Pyodide heap (its wasm memory), -1 if unknown."""
    try:
        import pyodide_js

        return int(pyodide_js._module.HEAP8.length)
    except Exception:
        return -1


@tool(safe_to_retry=True)
async def lookup(args: Query) -> str:
    """Look a fact up."""
    return f"{{args.q}}: {{FACT}}heap={{heap_bytes()}}"


AGENT = Agent("long-session", {INSTRUCTIONS!r}, [lookup], max_steps=4)


def make_deps(env, http):
    return None
'''
SUMMARY = (
    "The user has asked a long series of questions about topics of the project; each was "
    "looked up with the lookup tool (a read, nothing to repeat) and answered from its "
    "result. Nothing is open."
)
_VOCABULARY = (
    "deploy cache region latency billing invoice schema index replica quota retry token "
    "webhook queue worker durable object storage migration rollback alert metric budget "
    "customer order refund shipment ticket release branch review test build"
)
WORDS = _VOCABULARY.split()


# -- the seeded history --------------------------------------------------------------


def history_turn(rng: random.Random, n: int) -> list[Message]:
    """Turn `n` of the seeded history: a question, two lookups and their results, a reply."""

    def words(count: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(count))

    messages = [Message.user(f"Question {n}: what changed about {words(12)}?")]
    for k in range(2):
        call = ToolCall(f"seed{n}c{k}", "lookup", {"q": words(4)})
        messages.append(Message.assistant("Checking." if k == 0 else "One more.", [call]))
        messages.append(Message.tool_result(call, f"{call.arguments['q']}: {words(24)}"))
    messages.append(Message.assistant(f"In short: {words(16)}."))
    return messages


def seeded_messages(count: int, seed: int = 20) -> list[Message]:
    """Whole turns, at least `count` messages, ending on a reply."""
    rng = random.Random(seed)
    messages: list[Message] = []
    while len(messages) < count:
        messages += history_turn(rng, len(messages) // 6)
    return messages


def content_bytes(messages: list[Message]) -> int:
    """What the messages hold: their texts and their calls as JSON."""
    total = 0
    for m in messages:
        total += len(m.content.encode())
        total += sum(len(json.dumps(c.to_dict()).encode()) for c in m.tool_calls)
    return total


def database_of(kind: str, state_dir: Path, session_id: str) -> Path:
    """The SQLite file that holds the session's messages under `kind`."""
    if kind == "d1":
        pattern = state_dir / "v3" / "d1" / "miniflare-D1DatabaseObject" / "*.sqlite"
    else:
        pattern = state_dir / "v3" / "do" / "*" / f"{session_id}.sqlite"
    files = [f for f in glob.glob(str(pattern)) if not f.endswith("metadata.sqlite")]
    if len(files) != 1:
        raise SystemExit(f"bench: expected one database for {kind} at {pattern}, found {files}")
    return Path(files[0])


def stored_count(database: Path, session_id: str, where: str = "") -> int:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        row = db.execute(
            f"SELECT COUNT(*) FROM agent_messages WHERE session_id = ? {where}", (session_id,)
        ).fetchone()
    return int(row[0])


def seed(database: Path, session_id: str, messages: list[Message], batch: int = 2000) -> None:
    """Append `messages` to the session in `database` as the kit does: atomic appends at
    the stored count, in order (the file is the running server's)."""

    async def append() -> None:
        store = SQLiteStore(database)
        try:
            at = stored_count(database, session_id)
            for start in range(0, len(messages), batch):
                chunk = messages[start : start + batch]
                at = await store.append_messages_atomic(
                    session_id, at, chunk, agent_name="long-session"
                )
        finally:
            await store.close()

    asyncio.run(append())


# -- the fake model ------------------------------------------------------------------


class FakeModel:
    """An OpenAI-compatible model on 127.0.0.1. A request with tools: a `lookup` call for
    the turn's question, then an answer from its result. Without tools (the kit's
    summarizer): `SUMMARY`. Records each request: its bytes, whether it had tools, its
    JSON (`bodies`), and the heap size the turn's tool result reports."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.with_tools: list[bool] = []
        self.bodies: list[dict[str, Any]] = []
        self.heaps: list[int] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _model_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def worker_env(self) -> dict[str, str]:
        return {"LLM_PROVIDER": "openai", "LLM_BASE_URL": f"{self.url}/v1", "LLM_MODEL": "fake"}

    def __enter__(self) -> FakeModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def answer(self, raw: bytes) -> dict[str, Any]:
        body = json.loads(raw)
        messages = body["messages"]
        tools = bool(body.get("tools"))
        heap = re.search(r"heap=(-?\d+)", str(messages[-1].get("content") or ""))
        with self._lock:
            self.sizes.append(len(raw))
            self.with_tools.append(tools)
            self.bodies.append(body)
            if heap and messages[-1]["role"] == "tool":
                self.heaps.append(int(heap.group(1)))
        message: dict[str, Any] = {"role": "assistant", "content": SUMMARY}
        if tools:
            start = max(i for i, m in enumerate(messages) if m["role"] == "user")
            results = [m for m in messages[start:] if m["role"] == "tool"]
            if results:
                message["content"] = "From the record: " + results[-1]["content"][:80]
            else:
                topic = messages[start]["content"][:40]
                call = {"name": "lookup", "arguments": json.dumps({"q": topic})}
                message["content"] = "Checking."
                message["tool_calls"] = [
                    {"id": f"call_{time.monotonic_ns()}", "type": "function", "function": call}
                ]
        finish = "tool_calls" if "tool_calls" in message else "stop"
        return {
            "id": "chatcmpl-long", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": 20,
                      "total_tokens": len(raw) // 4 + 20},
        }  # fmt: skip

    def since(self, index: int) -> tuple[int, int, int]:
        """Of the requests from `index` on: (summary calls, their bytes, the largest
        request with tools)."""
        with self._lock:
            pairs = list(zip(self.sizes[index:], self.with_tools[index:], strict=True))
        summaries = [size for size, tools in pairs if not tools]
        turn = [size for size, tools in pairs if tools]
        return len(summaries), sum(summaries), max(turn, default=0)


def _chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """The completion as a stream sends it: the message in one delta, the finish, the usage."""
    message = completion["choices"][0]["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    base = {"id": "chatcmpl-long", "object": "chat.completion.chunk", "model": "fake"}
    finish = completion["choices"][0]["finish_reason"]
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {**base, "choices": [], "usage": completion["usage"]},
    ]


def _model_handler(model: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            completion = model.answer(raw)
            if json.loads(raw).get("stream") is True:
                events = [f"data: {json.dumps(c)}\n\n" for c in _chunks(completion)]
                data, kind = "".join([*events, "data: [DONE]\n\n"]).encode(), "text/event-stream"
            else:
                data, kind = json.dumps(completion).encode(), "application/json"
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

    return Handler


# -- workerd's memory ----------------------------------------------------------------


def workerd_pids(root: int) -> list[int]:
    """The workerd processes under process `root` (the dev server)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        names[int(entry)] = stat[stat.index("(") + 1 : stat.rindex(")")]
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if names.get(pid, "").startswith("workerd"):
            found.append(pid)
        todo += children.get(pid, [])
    return found


def status_mb(pids: list[int], key: str) -> float:
    """`key` (VmRSS, VmHWM) of /proc/<pid>/status, summed over `pids`, in MB."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
    return total / 1024


@contextlib.contextmanager
def rss_peak(pids: list[int], every: float = 0.02) -> Iterator[list[float]]:
    """Samples VmRSS while the block runs; the list holds the peak (MB) after it."""
    peak = [status_mb(pids, "VmRSS")]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every):
            peak[0] = max(peak[0], status_mb(pids, "VmRSS"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak[0] = max(peak[0], status_mb(pids, "VmRSS"))


# -- the measurement -----------------------------------------------------------------


def post(url: str, path: str, body: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method="POST",
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply: dict[str, Any] = json.loads(response.read())
    if reply.get("status") != "complete":
        raise SystemExit(f"bench: a turn did not complete: {str(reply)[:2000]}")
    return reply


def turn(url: str, model: FakeModel, name: str, text: str) -> tuple[float, dict[str, Any], int]:
    """One turn: (ms, the reply, the index of its first model request)."""
    first = len(model.sizes)
    t0 = time.perf_counter()
    reply = post(url, f"/sessions/{name}/messages", {"message": text})
    return (time.perf_counter() - t0) * 1000, reply, first


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 10 else max(values)


def bench_store(kind: str, model: FakeModel, args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder)
        agent = state / "long_session_agent.py"
        agent.write_text(AGENT, encoding="utf-8")
        env = {**model.worker_env(), "API_TOKEN": TOKEN, "SESSION_STORE": kind,
               "WORKERS_PLAN": args.plan}  # fmt: skip
        dev_args = ["--persist-to", str(state / "state"), "--dev-vars", str(state / "none")]
        server = DevServer([*dev_args, "--agent", str(agent)], env=env).start()
        try:
            assert server.process is not None
            everyone = workerd_pids(server.process.pid)
            _, made, _ = turn(server.url, model, "long", "hello")
            # wrangler dev runs two workerd processes; the Worker's (its isolate, its
            # Durable Objects, the local D1) is the larger once a turn has run.
            pids = [max(everyone, key=lambda pid: status_mb([pid], "VmRSS"))]
            others = [pid for pid in everyone if pid not in pids]
            rss_start, other_start = status_mb(pids, "VmRSS"), status_mb(others, "VmRSS")
            session_id = str(made["session_id"])
            database = database_of(kind, state / "state", session_id)
            history = seeded_messages(args.messages)
            t0 = time.perf_counter()
            seed(database, session_id, history)
            seed_s = time.perf_counter() - t0
            stored = stored_count(database, session_id)
            turn(server.url, model, "fresh", "hello")  # the fresh session, warm like the long
            print(
                f"{kind}: dev server started in {server.start_s:.1f} s; "
                f"seeded {len(history):,} messages ({content_bytes(history) / 1e6:.2f} MB of "
                f"content) in {seed_s:.1f} s: the session holds {stored:,}",
                flush=True,
            )
            rss_before = status_mb(pids, "VmRSS")
            heap_before = model.heaps[-1]
            with rss_peak(pids) as peak:
                first_ms, _, first = turn(server.url, model, "long", "What is open now?")
            calls, summary_bytes, first_request = model.since(first)
            rss_after_first = status_mb(pids, "VmRSS")
            heap_after_first = model.heaps[-1]
            summaries = stored_count(database, session_id, "AND summary_of IS NOT NULL")
            print(
                f"{kind}: first turn on the long session (loads its {stored:,} messages, "
                f"compacts: {calls} summary LLM calls, {summary_bytes / 1e6:.2f} MB sent to "
                f"them; {summaries} summary stored): {first_ms:,.0f} ms; its model request "
                f"{first_request / 1e3:.1f} kB",
                flush=True,
            )
            times: dict[str, list[float]] = {"long": [], "fresh": []}
            sizes: dict[str, list[int]] = {"long": [], "fresh": []}
            for i in range(args.warmup + args.turns):
                order = ("long", "fresh") if i % 2 == 0 else ("fresh", "long")
                for name in order:
                    ms, _, start = turn(server.url, model, name, f"Question {i}: and {name}?")
                    if i >= args.warmup:
                        times[name].append(ms)
                        sizes[name].append(model.since(start)[2])
            rss_end, hwm_end = status_mb(pids, "VmRSS"), status_mb(pids, "VmHWM")
            other_end = status_mb(others, "VmRSS")
            total = stored_count(database, session_id)
        finally:
            server.stop()
    long, fresh = times["long"], times["fresh"]
    n = args.turns
    print(
        f"{kind}: n={n} turns each, interleaved: long session median "
        f"{statistics.median(long):.1f} ms (p90 {p90(long):.1f}), fresh session median "
        f"{statistics.median(fresh):.1f} ms (p90 {p90(fresh):.1f}); long/fresh "
        f"{statistics.median(long) / statistics.median(fresh):.2f} (p90 "
        f"{p90(long) / p90(fresh):.2f}); model request {max(sizes['long']) / 1e3:.1f} kB vs "
        f"{max(sizes['fresh']) / 1e3:.1f} kB; {total:,} messages stored at the end",
        flush=True,
    )
    heap_mb = [h / 2**20 for h in (heap_before, heap_after_first, model.heaps[-1])]
    print(
        f"{kind}: the Worker's workerd, VmRSS: {rss_start:.0f} MB after a first turn, "
        f"{rss_before:.0f} MB before the first long turn, peak {peak[0]:.0f} MB during it, "
        f"{rss_after_first:.0f} MB after, {rss_end:.0f} MB at the end (VmHWM "
        f"{hwm_end:.0f} MB); the isolate's Pyodide heap before / after the first long turn / "
        f"at the end: {heap_mb[0]:.0f} / {heap_mb[1]:.0f} / {heap_mb[2]:.0f} MB; wrangler's "
        f"other workerd {other_start:.0f} -> {other_end:.0f} MB",
        flush=True,
    )
    figures.update(
        long_median=statistics.median(long), long_p90=p90(long),
        fresh_median=statistics.median(fresh), fresh_p90=p90(fresh), first_ms=first_ms,
        long_request=max(sizes["long"]), fresh_request=max(sizes["fresh"]),
        rss_before=rss_before, rss_peak=peak[0], rss_end=rss_end,
    )  # fmt: skip
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20, help="measured turns per session")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000, help="the long session's size")
    parser.add_argument("--plan", default="free", help="WORKERS_PLAN for the dev server")
    parser.add_argument("--stores", default="d1,durable-object")
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    with FakeModel() as model:
        for kind in args.stores.split(","):
            results[kind] = bench_store(kind, model, args)
    print(f"\n{'':<38}" + "".join(f"{k:>16}" for k in results))
    rows: tuple[tuple[str, Callable[[dict[str, float]], str]], ...] = (
        ("first long turn (compacts), ms", lambda r: f"{r['first_ms']:,.0f}"),
        ("long-session turn, median ms", lambda r: f"{r['long_median']:.1f}"),
        ("fresh-session turn, median ms", lambda r: f"{r['fresh_median']:.1f}"),
        ("long / fresh, median (p90)",
         lambda r: f"{r['long_median'] / r['fresh_median']:.2f} "
                   f"({r['long_p90'] / r['fresh_p90']:.2f})"),
        ("model request, long / fresh, kB",
         lambda r: f"{r['long_request'] / 1e3:.0f} / {r['fresh_request'] / 1e3:.1f}"),
        ("workerd RSS before / peak / end, MB",
         lambda r: f"{r['rss_before']:.0f}/{r['rss_peak']:.0f}/{r['rss_end']:.0f}"),
    )  # fmt: skip
    for label, cell in rows:
        print(f"{label:<38}" + "".join(f"{cell(r):>16}" for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
