"""Streams through the dev server unbuffered (issue 12, item 3): real processes, real HTTP.

tests/workers/streaming/ is a Worker whose Durable Object answers a body it writes from
an asyncio task (the readable side of a TransformStream, the task handed to
ctx.waitUntil), one SSE event every 200 ms. Served by `node runtime/dev-server.mjs
--config ...` and read over HTTP on 127.0.0.1: the first event reaches the client long
before the object writes the last one, the events arrive in order and complete, a client
that goes away after the first event leaves the server serving and the object's task
finishing its work, and complete and bodyless answers keep their framing. The kit's own
Worker gets the chat page setting (CHAT_PAGE, on unless set otherwise).

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
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

from durable_agents.testing.worker import DevWorker
from served_worker import ServedWorker

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

    def log_line(self, start: str, timeout: float = 10) -> str:
        """The request line the server logged for a request starting `start`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if line.startswith(start)]
            if found:
                return found[-1]
            time.sleep(0.02)
        raise AssertionError(f"no log line {start!r}:\n{self.output[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    served = Server(tmp_path_factory.mktemp("dev-streams"))
    try:
        yield served
    finally:
        served.close()


def read_events(answer: http.client.HTTPResponse, limit: int) -> list[tuple[float, dict[str, Any]]]:
    """Up to `limit` SSE events, each with the time it reached the client."""
    events = []
    while len(events) < limit:
        line = answer.readline()
        if not line:
            break
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
    line = server.log_line(f"GET /do/first-{how}/{how}?")
    ms = int(re.search(r" 200 (\d+)ms$", line)[1])  # type: ignore[index]
    assert ms >= (CHUNKS - 1) * DELAY_S * 1000 * 0.9, line


def test_a_client_that_goes_away_leaves_the_object_writing_and_the_server_serving(
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
    line = server.log_line("GET /do/gone/stream?")
    assert line.endswith(" - (the client went away mid-body)"), line
    assert re.search(r" 200 \d+ms ", line), line
    # The server serves on, while the object's task still writes.
    status, _, body = server.request("GET", "/text")
    assert (status, body) == (200, b"a body that is complete")
    assert not server.report("gone")[-1]["finished"]
    # The object's task finished its work: every chunk tried, those after the client
    # left failed (the stream was cancelled), none was lost silently.
    run = wait_finished(server, "gone")
    assert run["written"] >= 1
    assert run["failed"] >= 1
    assert run["written"] + run["failed"] == CHUNKS
    assert server.process.poll() is None
    assert "dev: the Worker's response body failed" not in server.output


@pytest.mark.parametrize(
    ("name", "query", "events", "logged"),
    [
        ("broken", "abort_after=2", 2, "the object broke its stream"),
        ("strings", "as=text", 0, "a body stream must give bytes"),
    ],
)
def test_a_body_that_fails_mid_way_is_cut_short_and_the_server_serves_on(
    server: Server, name: str, query: str, events: int, logged: str
) -> None:
    """The Worker's stream errors (the object aborts it, or gives strings, which workerd
    refuses in a body): the client gets the head and what came before, then the body
    cut short (no last chunk), as from workerd; the server logs why and serves on."""
    connection = server.connect()
    connection.request("GET", f"/do/{name}/stream?chunks={CHUNKS}&delay=0.05&{query}")
    answer = connection.getresponse()
    assert answer.status == 200
    assert [e["i"] for _, e in read_events(answer, events)] == list(range(events))
    with pytest.raises(http.client.IncompleteRead):
        answer.read()
    connection.close()
    line = server.log_line(f"GET /do/{name}/stream?")
    assert line.endswith(" - (the Worker's body failed mid-way)"), line
    deadline = time.monotonic() + 5
    while logged not in server.output:
        assert time.monotonic() < deadline, server.output[-3000:]
        time.sleep(0.05)
    status, _, body = server.request("GET", "/text")
    assert (status, body) == (200, b"a body that is complete")
    run = wait_finished(server, name)
    assert run["written"] + run["failed"] == CHUNKS
    assert run["failed"] >= 1
    assert server.process.poll() is None


def test_complete_and_bodyless_answers(server: Server) -> None:
    # A body built from a string: content-length, not chunked; HEAD the same head.
    status, headers, body = server.request("GET", "/text")
    assert (status, body) == (200, b"a body that is complete")
    assert headers["content-length"] == str(len(body))
    assert "transfer-encoding" not in headers
    status, headers, body = server.request("HEAD", "/text")
    assert (status, body, headers["content-length"]) == (200, b"", "23")
    # 204: no body, no length.
    status, headers, body = server.request("GET", "/empty")
    assert (status, body) == (204, b"")
    assert "content-length" not in headers
    assert "transfer-encoding" not in headers
    # HEAD of a streamed answer: the head at once, no body; the keep-alive connection
    # then carries the next request. The object's writes fail (its body was cancelled)
    # and its task still finishes.
    connection = server.connect()
    started = time.monotonic()
    connection.request("HEAD", f"/do/head/stream?{STREAM}")
    answer = connection.getresponse()
    assert answer.status == 200
    assert answer.getheader("content-type") == "text/event-stream; charset=utf-8"
    assert answer.getheader("content-length") is None
    assert answer.read() == b""
    assert time.monotonic() - started < 1.0
    connection.request("GET", "/text")
    again = connection.getresponse()
    assert (again.status, again.read()) == (200, b"a body that is complete")
    connection.close()
    run = wait_finished(server, "head")
    assert run["written"] + run["failed"] == CHUNKS
    assert run["failed"] >= CHUNKS - 1


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
    """The dev server sets CHAT_PAGE=on for the kit's Worker and says where the page is;
    .dev.vars (or [vars], or the environment) can turn it off."""
    on = DevWorker(ROOT, tmp_path / "on").start()
    try:
        ready = on.lines.index(f"ready on {on.url}")
        deadline = time.monotonic() + 10
        while len(on.lines) <= ready + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert on.lines[ready + 1] == f"dev: chat page: {on.url}/"
        assert not any("test-token" in line for line in on.lines)
        page = on.request("GET", "/", token="")
        assert page.status == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
    finally:
        on.close()
    off = DevWorker(ROOT, tmp_path / "off", settings={"CHAT_PAGE": "off"}).start()
    try:
        assert not any(line.startswith("dev: chat page") for line in off.lines)
        assert off.request("GET", "/", token="").status != 200
    finally:
        off.close()
