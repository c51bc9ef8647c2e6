"""The first request on fresh state (issue 30): `scripts/dev` answers on its port only once
the D1 database is migrated, so a request sent the moment the port accepts a connection
is served, not refused for a table that is not there yet. Twice: on a fresh `--persist-to`
folder (every migration applied before wrangler starts) and again on the same folder (up
to date: wrangler's command is not run at all; the server says when it runs it). The
triage example, offline (its model and dev stubs), on a port the test picks, polled with
connect() in a tight loop.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PROJECT, START_TIMEOUT_S, TRIAGE_AGENT

from durable_agents.testing.worker import DevWorker

pytestmark = pytest.mark.slow

TOKEN = "test-token"
# What the server says before it runs wrangler's migrations command (and only then).
MIGRATING = "dev: D1 migrations to apply (durable-agents): wrangler d1 migrations apply --local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_and_post_at_once(worker: DevWorker) -> tuple[int, Any]:
    """Start `worker` (in a thread) and POST a message the moment its port accepts a TCP
    connection, not when the server says it is ready; the answer's status and JSON body."""
    started: Future[DevWorker] = Future()

    def start() -> None:
        try:
            started.set_result(worker.start())
        except BaseException as exc:  # handed to the test
            started.set_exception(exc)

    threading.Thread(target=start, daemon=True).start()
    while True:
        if started.done() and started.exception() is not None:
            raise AssertionError("the dev server did not start") from started.exception()
        try:
            socket.create_connection(("127.0.0.1", worker.port), timeout=5).close()
            break
        except OSError:
            continue
    request = urllib.request.Request(
        f"http://127.0.0.1:{worker.port}/sessions/issue-42/messages",
        data=json.dumps({"message": "triage issue 42"}).encode(),
        method="POST",
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=START_TIMEOUT_S) as response:
            answer = response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            answer = error.code, error.read().decode(errors="replace")
    started.result(START_TIMEOUT_S)  # and it did get ready
    return answer


def test_the_first_request_on_fresh_state_and_after_a_restart_is_served(tmp_path: Path) -> None:
    worker = DevWorker(
        PROJECT, tmp_path / "state", agent=TRIAGE_AGENT, token=TOKEN,
        start_timeout=START_TIMEOUT_S, port=free_port(), migrated_d1=False,
    )  # fmt: skip
    try:
        status, reply = start_and_post_at_once(worker)
        assert status == 200, f"{reply}\n" + "\n".join(worker.lines)
        assert reply["status"] == "complete", reply
        banner = worker.wait_for_line(r"dev: state in .*; D1 migrations: ")
        assert "D1 migrations: 0001_init.sql, " in banner, banner
        assert MIGRATING in worker.lines, worker.lines
        worker.stop()

        worker.lines.clear()
        worker.port = free_port()
        status, reply = start_and_post_at_once(worker)
        assert status == 200, f"{reply}\n" + "\n".join(worker.lines)
        assert reply["status"] == "complete", reply
        banner = worker.wait_for_line(r"dev: state in .*; D1 migrations: ")
        assert banner.endswith("D1 migrations: up to date"), banner
        assert not any(line.startswith("dev: D1 migrations to apply") for line in worker.lines)
        assert worker.count("SELECT * FROM agent_messages WHERE role = 'user'") == 2
    finally:
        worker.close()
