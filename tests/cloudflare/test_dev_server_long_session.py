"""A session past 20,000 messages, over HTTP against `scripts/dev` (real workerd), D1 store.

Issue 20, item 2: a turn loads what it needs (the latest summary and the messages
after it), not the whole history. A session made by one real turn is grown past
20,000 messages (scripts/bench_long_session.py's realistic mix, ~2.8 MB, written
into the local D1's SQLite file with the kit's own atomic appends while the
server runs). Its next turn compacts once (the summary calls go to the fake
model without tools) and sends the model a window: the instructions, the
summary, the messages after the cut; a second turn sends a window too, and
compacts nothing. Every message stays stored.

Sizes, counts and contents are asserted; the timings are printed only (the
machine is shared: the benchmark, scripts/bench_long_session.py, measures them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.support.worker_fakes import PROJECT, DevServer

pytestmark = pytest.mark.slow
WINDOW_BYTES = 300_000  # a window is about 32,000-64,000 estimated tokens: ~130-260 kB


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, PROJECT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench = _script("bench_long_session")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevServer, Any]]:
    folder = tmp_path_factory.mktemp("long-session")
    agent = folder / "long_session_agent.py"
    agent.write_text(bench.AGENT, encoding="utf-8")
    with bench.FakeModel() as model:
        # A placeholder key that is a word of the summary (issue 30): the summary call
        # (a whole, non-streamed reply) must store the model's text as it was sent.
        env = {
            **model.worker_env(),
            "API_TOKEN": "test-token",
            "SESSION_STORE": "d1",
            "LLM_API_KEY": "open",
        }
        dev = DevServer(folder / "state", env, agent=agent)
        dev.start()
        try:
            yield dev, model
        finally:
            dev.kill_all()


def summary_ends(database: Path, session_id: str) -> list[int]:
    """The `summary_of` of every stored summary of the session, in order."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT summary_of FROM agent_messages WHERE session_id = ? "
            "AND summary_of IS NOT NULL ORDER BY seq",
            (session_id,),
        ).fetchall()
    return [int(row[0]) for row in rows]


def take_turn(dev: DevServer, model: Any, text: str) -> tuple[float, list[dict[str, Any]]]:
    """A turn on the long session: (seconds, the model requests it made: (bytes, body))."""
    first = len(model.bodies)
    started = time.monotonic()
    answer = dev.worker.post("/sessions/long/messages", {"message": text}, timeout=300)
    elapsed = time.monotonic() - started
    assert answer.status == 200, (answer.status, answer.text[:2000], dev.lines[-30:])
    assert answer.body["status"] == "complete", answer.body
    assert answer.body["response"].startswith("From the record: ")
    return elapsed, [
        {"bytes": size, "body": body}
        for size, body in zip(model.sizes[first:], model.bodies[first:], strict=True)
    ]


def check_window(body: dict[str, Any], size: int, cut: int, stored: int, text: str) -> None:
    """A request of a turn: the instructions, the summary, the stored messages from `cut`
    to `stored`, then the turn's own (its question first)."""
    assert body.get("tools"), "a turn's request offers the tools"
    assert size < WINDOW_BYTES, f"the model was sent {size:,} bytes"
    assert len(json.dumps(body).encode()) < WINDOW_BYTES
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": bench.INSTRUCTIONS}
    assert messages[1]["role"] == "system"
    assert messages[1]["content"].startswith("Summary of the conversation")
    assert messages[1]["content"].endswith(bench.SUMMARY)
    assert all(m["role"] != "system" for m in messages[2:])
    assert messages[2]["role"] == "user"  # the tail begins where a turn began
    turn = next(i for i, m in enumerate(messages) if m["role"] == "user" and m["content"] == text)
    assert turn == 2 + stored - cut, (turn, stored, cut)


def test_a_turn_on_a_session_of_20000_messages_sends_the_model_a_window(
    served: tuple[DevServer, Any],
) -> None:
    dev, model = served
    made = dev.worker.post("/sessions/long/messages", {"message": "hello"}, timeout=120)
    assert made.status == 200, (made.status, made.text[:2000], dev.lines[-30:])
    session_id = made.body["session_id"]
    database = bench.database_of("d1", dev.state_dir, session_id)
    history = bench.seeded_messages(20_000)
    started = time.monotonic()
    bench.seed(database, session_id, history)
    seeded_s = time.monotonic() - started
    stored = bench.stored_count(database, session_id)
    assert stored == 4 + len(history) > 20_000
    assert bench.content_bytes(history) > 2_500_000

    first_s, requests = take_turn(dev, model, "What is open now?")
    summaries = [r for r in requests if not r["body"].get("tools")]
    calls = [r for r in requests if r["body"].get("tools")]
    assert len(calls) == 2  # the lookup, then the answer
    assert len(summaries) >= 10  # ~2.8 MB folded, ~128 kB of transcript a call
    for summary in summaries:
        assert summary["bytes"] < WINDOW_BYTES
        assert [m["role"] for m in summary["body"]["messages"]] == ["system", "user"]
    (cut,) = summary_ends(database, session_id)
    assert cut > 0
    assert stored - cut < 2_000  # a window of ~32,000 estimated tokens
    stored_now = stored + 1  # the summary
    check_window(calls[0]["body"], calls[0]["bytes"], cut, stored, "What is open now?")
    check_window(calls[1]["body"], calls[1]["bytes"], cut, stored, "What is open now?")

    second_s, requests = take_turn(dev, model, "And since then?")
    assert all(r["body"].get("tools") for r in requests), "the second turn compacts nothing"
    assert len(requests) == 2
    for request in requests:  # the first turn's 4 messages are in the window now
        check_window(request["body"], request["bytes"], cut, stored + 4, "And since then?")

    assert summary_ends(database, session_id) == [cut]
    assert bench.stored_count(database, session_id) == stored_now + 4 + 4  # nothing dropped
    print(
        f"\nseeded {len(history):,} messages in {seeded_s:.1f} s; first turn (loads "
        f"{stored:,}, {len(summaries)} summary calls) {first_s:.2f} s, model request "
        f"{calls[0]['bytes'] / 1e3:.0f} kB; second turn {second_s:.2f} s, "
        f"{requests[-1]['bytes'] / 1e3:.0f} kB"
    )
