"""Streams through the dev server unbuffered (issue 12, item 3): real processes, real HTTP.

tests/workers/streaming/ is a Worker whose Durable Object answers a body it writes from
an asyncio task (the readable side of a TransformStream, the task handed to
ctx.waitUntil), one SSE event every 200 ms. Served by `runtime/dev.py --config ...`
(`wrangler dev` on real workerd) and read over HTTP on 127.0.0.1: the first event
reaches the client long before the object writes the last one, the events arrive in
order and complete, a client that goes away after the first event leaves the server
and the object serving, a body that breaks mid-way is cut short, and complete and
bodyless answers keep their framing. The kit's own Worker gets the chat page setting
(CHAT_PAGE, on unless set otherwise).

Needs `scripts/setup-runtime` (node_modules/, the pinned Node and python_modules/).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import ServedWorker

from durable_agents.testing.worker import DevWorker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "workers" / "streaming" / "wrangler.toml"
CHUNKS = 5
DELAY_S = 0.2
STREAM = f"chunks={CHUNKS}&delay={DELAY_S}"


class Server(ServedWorker):
    """The streaming test Worker served (`served_worker.ServedWorker`), started at once."""

    def __init__(self, state: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "CHAT_PAGE"}
        super().__init__(CONFIG, state, env)
        self.start_ready()

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=30)

    def request(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        connection = self.connect()
        try:
            connection.request(method, path)
            answer = connection.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            connection.close()

    def report(self, name: str) -> list[dict[str, Any]]:
        status, _, body = self.request("GET", f"/do/{name}/report")
        assert status == 200, body
        runs: list[dict[str, Any]] = json.loads(body)["runs"]
        return runs

    def log_line(self, method: str, path: str, timeout: float = 10) -> str:
        """wrangler's log line of a request (`GET /path 200 OK (12ms)`, no query), logged
        when the Worker's answer starts."""
        return self.wait_line(
            rf"^{method} {re.escape(path)} \d{{3}} [A-Za-z ]+ \(\d+ms\)$", timeout
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    served = Server(tmp_path_factory.mktemp("dev-streams"))
    try:
        yield served
    finally:
        served.close()


def read_events(
    answer: http.client.HTTPResponse,
    limit: int,
    into: list[tuple[float, dict[str, Any]]] | None = None,
) -> list[tuple[float, dict[str, Any]]]:
    """Up to `limit` SSE events, each with the time it reached the client (appended to
    `into` as they come, if given). A chunked body cut short raises IncompleteRead
    (read1 says so; readline would take the cut for the body's end)."""
    events = [] if into is None else into
    buffered = b""
    while len(events) < limit:
        if b"\n" not in buffered:
            data = answer.read1(65536)
            if not data:
                break
            buffered += data
            continue
        line, buffered = buffered.split(b"\n", 1)
        if line.startswith(b"data: "):
            events.append((time.time(), json.loads(line[6:])))
    return events


def wait_finished(server: Server, name: str, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        runs = server.report(name)
        if runs and runs[-1]["finished"]:
            return runs[-1]
        assert time.monotonic() < deadline, runs
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["stream", "rewrap"])
def test_the_first_chunk_arrives_long_before_the_object_writes_the_last(
    server: Server, how: str
) -> None:
    """The object's Response as the stub gives it, or the Worker's own Response around
    its JS body: either way each chunk reaches the client as the object writes it."""
    connection = server.connect()
    sent = time.time()
    connection.request("GET", f"/do/first-{how}/{how}?{STREAM}")
    answer = connection.getresponse()
    head_at = time.time()
    assert answer.status == 200
    headers = {k.lower(): v for k, v in answer.getheaders()}
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers
    assert "content-encoding" not in headers  # never compressed
    assert (headers.get("x-rewrapped") == "yes") == (how == "rewrap")
    events = read_events(answer, CHUNKS + 1)
    assert answer.read() == b""  # the body ends after the last event
    assert [event["i"] for _, event in events] == list(range(CHUNKS))
    first_seen, last_written = events[0][0], events[-1][1]["written_at"]
    # The head and the first event come at once, not when the object has written all.
    assert head_at - sent < 1.0
    assert first_seen - sent < 1.0
    assert last_written - first_seen > (CHUNKS - 1) * DELAY_S * 0.75
    # Each event reaches the client within a moment of the object writing it.
    for seen, event in events:
        assert seen - event["written_at"] < 0.3, (seen, event)
        assert seen >= event["written_at"] - 0.05
    # The connection is reusable: the chunked body was framed right.
    connection.request("GET", "/text")
    again = connection.getresponse()
    assert (again.status, again.read()) == (200, b"a body that is complete")
    connection.close()
    # wrangler logs the request when its answer starts (the path, without the query).
    assert " 200 OK " in server.log_line("GET", f"/do/first-{how}/{how}")


def test_a_client_that_goes_away_leaves_the_server_and_the_object_serving(
    server: Server,
) -> None:
    connection = server.connect()
    connection.request("GET", f"/do/gone/stream?{STREAM}")
    answer = connection.getresponse()
    assert answer.status == 200
    [(_, first)] = read_events(answer, 1)
    assert first["i"] == 0
    assert connection.sock is not None
    connection.sock.close()  # the client goes away after the first event
    connection.close()
    left_at = time.monotonic()
    assert " 200 OK " in server.log_line("GET", "/do/gone/stream")
    # The server serves on, and so does the object (its task still runs).
    status, _, body = server.request("GET", "/text")
    assert (status, body) == (200, b"a body that is complete")
    # The same object streams a whole body to the next client.
    status, headers, body = server.request("GET", f"/do/gone/stream?{STREAM}")
    assert (status, headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: ")]
    assert [event["i"] for event in events] == list(range(CHUNKS))
    # workerd does not cancel the abandoned body's stream: the task's writes after the
    # first few (what the pipe buffers) neither complete nor fail, long after the
    # object would have written them all. (The kit must not count on a failing write
    # to learn that its client left.)
    time.sleep(max(0.0, (CHUNKS - 1) * DELAY_S * 2 - (time.monotonic() - left_at)))
    abandoned, again = server.report("gone")
    assert again == {"chunks": CHUNKS, "written": CHUNKS, "failed": 0, "finished": True}
    assert abandoned["failed"] == 0
    assert 1 <= abandoned["written"] < CHUNKS
    assert not abandoned["finished"]
    assert server.running


def test_a_body_that_fails_mid_way_is_cut_short_and_the_server_serves_on(server: Server) -> None:
    """The object aborts its stream before its third event: the client gets the head
    and at most the events written before, then the body cut short (no last chunk);
    workerd logs why; the server serves on."""
    connection = server.connect()
    connection.request("GET", f"/do/broken/stream?chunks={CHUNKS}&delay=0.05&abort_after=2")
    answer = connection.getresponse()
    assert answer.status == 200
    assert answer.getheader("transfer-encoding") == "chunked"
    events: list[tuple[float, dict[str, Any]]] = []
    with pytest.raises(http.client.IncompleteRead):
        read_events(answer, CHUNKS + 1, into=events)
    # The abort discards what the pipe still held: the first event, perhaps the second.
    assert [event["i"] for _, event in events] in ([0], [0, 1])
    connection.close()
    assert " 200 OK " in server.log_line("GET", "/do/broken/stream")  # its head was sent
    server.wait_line(r"Uncaught Error: the object broke its stream", timeout=5)
    status, _, body = server.request("GET", "/text")
    assert (status, body) == (200, b"a body that is complete")
    run = wait_finished(server, "broken")
    assert run["written"] + run["failed"] == CHUNKS
    assert run["written"] >= 1
    assert run["failed"] >= 1
    assert server.running


def test_a_body_stream_of_strings_is_sent_as_text(server: Server) -> None:
    """The object writes str chunks, not bytes: workerd sends them as text, framed."""
    status, headers, body = server.request(
        "GET", f"/do/strings/stream?chunks={CHUNKS}&delay=0.05&as=text"
    )
    assert (status, headers["transfer-encoding"]) == (200, "chunked")
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: ")]
    assert [event["i"] for event in events] == list(range(CHUNKS))
    assert body == b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    run = wait_finished(server, "strings")
    assert run == {"chunks": CHUNKS, "written": CHUNKS, "failed": 0, "finished": True}


def test_complete_and_bodyless_answers(server: Server) -> None:
    # A body built from a string: content-length, not chunked; HEAD the same head, no body.
    status, headers, body = server.request("GET", "/text")
    assert (status, body) == (200, b"a body that is complete")
    assert headers["content-length"] == str(len(body))
    assert "transfer-encoding" not in headers
    status, head, body = server.request("HEAD", "/text")
    assert (status, body, head["content-type"]) == (200, b"", headers["content-type"])
    assert "transfer-encoding" not in head
    # 204: no body, no length.
    status, headers, body = server.request("GET", "/empty")
    assert (status, body) == (204, b"")
    assert "content-length" not in headers
    assert "transfer-encoding" not in headers
    # HEAD of a streamed answer: the head, no body; the keep-alive connection then
    # carries the next request. workerd reads the object's body to its end and drops
    # it: the object's task writes every chunk and finishes.
    connection = server.connect()
    connection.request("HEAD", f"/do/head/stream?{STREAM}")
    answer = connection.getresponse()
    assert answer.status == 200
    assert answer.getheader("content-type") == "text/event-stream; charset=utf-8"
    assert answer.getheader("content-length") is None
    assert answer.read() == b""
    connection.request("GET", "/text")
    again = connection.getresponse()
    assert (again.status, again.read()) == (200, b"a body that is complete")
    connection.close()
    run = wait_finished(server, "head")
    assert run["written"] + run["failed"] == CHUNKS


def test_two_streams_at_once_do_not_wait_for_each_other(server: Server) -> None:
    results: dict[str, list[tuple[float, dict[str, Any]]]] = {}

    def read(name: str) -> None:
        connection = server.connect()
        connection.request("GET", f"/do/{name}/stream?{STREAM}")
        results[name] = read_events(connection.getresponse(), CHUNKS + 1)
        connection.close()

    started = time.time()
    readers = [threading.Thread(target=read, args=(name,)) for name in ("left", "right")]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(20)
    assert [[e["i"] for _, e in results[name]] for name in ("left", "right")] == [
        list(range(CHUNKS)),
        list(range(CHUNKS)),
    ]
    # Both in about the time of one (4 gaps of 200 ms), not one after the other.
    assert max(seen for name in results for seen, _ in results[name]) - started < 1.6


def test_the_kit_worker_gets_the_chat_page_setting(tmp_path: Path) -> None:
    """The dev server sets CHAT_PAGE=on for the kit's Worker and says where the page is
    (test_dev_server.py's quickstart checks that); .dev.vars (or [vars], or the
    environment) can turn it off."""
    off = DevWorker(ROOT, tmp_path / "off", settings={"CHAT_PAGE": "off"}).start()
    try:
        assert not any(line.startswith("dev: chat page") for line in off.lines)
        assert off.request("GET", "/", token="").status != 200
    finally:
        off.close()
