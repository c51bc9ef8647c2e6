"""Odd and hostile requests to `scripts/dev`, sent over raw sockets.

HTTP is workerd's now (behind wrangler's proxy Worker, as `wrangler dev` runs it):
what it cannot hand to the Worker it refuses itself: CONNECT, `OPTIONS *` and
absolute- or authority-form targets with a 500, a method it does not know (TRACK,
M-SEARCH) with a 501, a request whose headers never end by closing the connection
(after its 15 s header timeout); a body that never arrives it waits for. Everything
else reaches the Worker, which answers with its error shape (`{"error": {"code",
"message"}}`): TRACE and the other methods a route does not take (405 with the
route's `Allow`), a declared Content-Length over the limit (413 before any of the
body is read, also after workerd's automatic `100 Continue`), a token with odd
whitespace (401). Whatever is sent, nothing of it reaches the model, the webhook or
D1, and the server goes on serving: the session written before stays readable and
takes a new turn.

One dev server (the fake LLM, issue tracker and webhook of worker_fakes) for the module.
Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
from tests.support.worker_fakes import DevServer, FakeServices, d1_query, durable_object_id

pytestmark = pytest.mark.slow

TOKEN = "test-token"
HEADER_TIMEOUT_S = 15  # workerd's: a request whose headers never end is dropped then
MESSAGE = json.dumps({"message": "triage issue 9"}).encode()


@dataclass
class Hostile:
    services: FakeServices
    server: DevServer
    calls: tuple[int, int] = (0, 0)  # (LLM requests, webhook posts) before the test's request

    @property
    def address(self) -> tuple[str, int]:
        url = urlsplit(self.server.url)
        assert url.hostname is not None
        assert url.port is not None
        return url.hostname, url.port


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    with FakeServices() as services:
        server = DevServer(
            tmp_path_factory.mktemp("hostile"), services.worker_env(), f"API_TOKEN={TOKEN}\n"
        )
        server.start()
        try:
            status, _, reply = server.request("POST", "/sessions/ok/messages", MESSAGE)
            assert status == 200, reply
            yield Hostile(services, server)
        finally:
            server.kill_all()


@pytest.fixture
def hostile(module_server: Hostile) -> Hostile:
    services = module_server.services
    module_server.calls = (len(services.llm_requests), len(services.posts))
    return module_server


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    seconds: float
    closed: bool  # the server closed the connection after answering

    def error(self) -> dict[str, str]:
        reply = json.loads(self.body)
        assert set(reply) == {"error"}, reply
        assert set(reply["error"]) == {"code", "message"}, reply
        assert self.headers["content-type"] == "application/json"
        error: dict[str, str] = reply["error"]
        assert error["message"]
        return error


def send_raw(hostile: Hostile, data: bytes, *, method: str = "GET", timeout: float = 10) -> Answer:
    """Send `data` as is on a new connection; the one answer read back (http.client parses it)."""
    started = time.monotonic()
    with socket.create_connection(hostile.address, timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        body = response.read()
        seconds = time.monotonic() - started
        sock.settimeout(1)  # a connection kept alive is not closed within 1 s
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        except ConnectionResetError:
            closed = True
    return Answer(response.status, response.headers, body, seconds, closed)


def request_bytes(
    method: str, target: str, *, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    all_headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if body:
        all_headers["Content-Length"] = str(len(body))
    all_headers.update(headers or {})
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return "\r\n".join([*lines, "", ""]).encode("latin-1") + body


def assert_still_serving_and_nothing_written(hostile: Hostile, name: str) -> None:
    """Nothing reached the fake LLM or webhook; the session `name` has no row in D1
    (read by wrangler); the server still runs, the session `ok` reads as before, and
    takes a new turn."""
    assert (len(hostile.services.llm_requests), len(hostile.services.posts)) == hostile.calls
    assert hostile.server.process is not None
    assert hostile.server.process.poll() is None, "the dev server died"
    status, _, history = hostile.server.request("GET", "/sessions/ok", timeout=30)
    assert status == 200, history
    assert history["messages"][0] == {"position": 0, "role": "user", "content": "triage issue 9"}
    status, _, reply = hostile.server.request("GET", f"/sessions/{name}", timeout=30)
    assert (status, reply["error"]["code"]) == (404, "session-not-found")
    session_id = durable_object_id(name)
    sql = (
        f"SELECT (SELECT COUNT(*) FROM agent_messages WHERE session_id = '{session_id}') AS m,"
        f" (SELECT COUNT(*) FROM agent_sessions WHERE id = '{session_id}') AS s"
    )
    assert d1_query(sql, hostile.server.state_dir) == [{"m": 0, "s": 0}]
    status, _, turn = hostile.server.request("POST", "/sessions/ok/messages", MESSAGE, timeout=60)
    assert (status, turn["status"]) == (200, "complete"), turn


def test_trace_reaches_the_worker_and_is_405_with_allow(hostile: Hostile) -> None:
    answer = send_raw(hostile, request_bytes("TRACE", "/sessions/h-trace/messages"))
    assert answer.status == 405
    assert answer.error()["code"] == "method-not-allowed"
    assert answer.headers["allow"] == "POST"
    assert answer.seconds < 5
    assert_still_serving_and_nothing_written(hostile, "h-trace")


def test_connect_is_refused_by_workerd_and_the_connection_closed(hostile: Hostile) -> None:
    data = request_bytes("CONNECT", "evil.example:443", headers={"Host": "evil.example:443"})
    answer = send_raw(hostile, data, method="CONNECT")
    assert answer.status == 500  # no tunnel: the Worker has no connect() handler
    assert answer.closed
    assert answer.seconds < 5
    assert_still_serving_and_nothing_written(hostile, "h-connect")


def test_options_asterisk_is_refused_before_the_worker(hostile: Hostile) -> None:
    answer = send_raw(hostile, request_bytes("OPTIONS", "*"))
    assert answer.status == 500  # wrangler's entry Worker cannot make a URL of `*`
    assert b"Fetch API cannot load" in answer.body
    assert answer.seconds < 5
    assert_still_serving_and_nothing_written(hostile, "h-options")


@pytest.mark.parametrize(
    "target",
    [
        "http://evil.example/sessions/h-absolute/messages",
        "http://127.0.0.1/sessions/h-absolute/messages",
        "evil.example:443",
    ],
)
def test_absolute_and_authority_form_targets_are_refused_before_the_worker(
    hostile: Hostile, target: str
) -> None:
    data = request_bytes("POST", target, body=MESSAGE, headers={"Host": "evil.example"})
    answer = send_raw(hostile, data, method="POST")
    assert answer.status == 500  # workerd: "Invalid URL string"; the Worker never runs
    assert answer.closed
    assert answer.seconds < 5
    assert_still_serving_and_nothing_written(hostile, "h-absolute")


def test_a_huge_declared_length_is_413_before_any_body_is_read(hostile: Hostile) -> None:
    data = request_bytes(
        "POST", "/sessions/h-huge/messages", headers={"Content-Length": "1000000000000000"}
    )
    answer = send_raw(hostile, data, method="POST")
    assert answer.status == 413
    assert answer.error()["code"] == "body-too-large"
    assert answer.closed  # the unread body is not taken for the next request
    assert answer.seconds < 5
    assert_still_serving_and_nothing_written(hostile, "h-huge")


def test_expect_100_continue_with_a_huge_length_is_413_after_workerds_100(
    hostile: Hostile,
) -> None:
    data = request_bytes(
        "POST",
        "/sessions/h-expect/messages",
        headers={"Content-Length": "1000000000000000", "Expect": "100-continue"},
    )
    with socket.create_connection(hostile.address, timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(4096):  # workerd answers 100 itself, then the Worker's 413
            received += chunk
    interim, final = received.split(b"\r\n\r\n", 1)
    assert interim == b"HTTP/1.1 100 Continue"
    assert final.startswith(b"HTTP/1.1 413 ")
    assert b'"code":"body-too-large"' in final
    assert_still_serving_and_nothing_written(hostile, "h-expect")


def test_expect_100_continue_gets_a_100_then_the_turn_runs(hostile: Hostile) -> None:
    data = request_bytes(
        "POST", "/sessions/expected/messages", body=MESSAGE, headers={"Expect": "100-continue"}
    )
    headers, body = data[: -len(MESSAGE)], MESSAGE
    with socket.create_connection(hostile.address, timeout=60) as sock:
        sock.sendall(headers)
        assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        reply = json.loads(response.read())
    assert response.status == 200, reply
    assert reply["session_id"] == durable_object_id("expected")


@pytest.mark.parametrize("method", ["TRACK", "M-SEARCH"])
def test_a_method_workerd_does_not_know_is_501(hostile: Hostile, method: str) -> None:
    name = f"h-{method.lower()}"
    answer = send_raw(hostile, request_bytes(method, f"/sessions/{name}/messages"))
    assert answer.status == 501
    assert answer.body == b"ERROR: Unrecognized request method."
    assert answer.closed
    assert_still_serving_and_nothing_written(hostile, name)


def test_a_body_declared_but_never_sent_holds_only_its_own_request(hostile: Hostile) -> None:
    """workerd has no request timeout: the Worker waits for the body as long as the
    client keeps the connection; meanwhile the server serves others. When the client
    gives up, the Worker's read fails (logged) and nothing is written."""
    data = request_bytes(
        "POST", "/sessions/h-nobody/messages", headers={"Content-Length": str(len(MESSAGE))}
    )
    with socket.create_connection(hostile.address, timeout=2) as stalled:
        stalled.sendall(data + MESSAGE[:10])
        status, _, history = hostile.server.request("GET", "/sessions/ok", timeout=30)
        assert status == 200, history
        with pytest.raises(TimeoutError):
            stalled.recv(1)  # no answer: the request is still being received
    hostile.server.wait_for_line(r"POST http://127\.0\.0\.1/sessions/h-nobody/messages", 30)
    assert_still_serving_and_nothing_written(hostile, "h-nobody")


def test_headers_never_finished_are_dropped_after_workerds_timeout(hostile: Hostile) -> None:
    data = request_bytes("POST", "/sessions/h-slow/messages", body=MESSAGE)
    with socket.create_connection(hostile.address, timeout=HEADER_TIMEOUT_S + 15) as stalled:
        started = time.monotonic()
        stalled.sendall(data[: data.index(b"\r\n\r\n")])
        status, _, history = hostile.server.request("GET", "/sessions/ok", timeout=30)
        assert status == 200, history  # the stalled request blocks no other
        try:
            received = stalled.recv(1024)
        except ConnectionResetError:
            received = b""
        seconds = time.monotonic() - started
    assert received == b"", "no answer, the connection closed"
    assert HEADER_TIMEOUT_S - 1 < seconds < HEADER_TIMEOUT_S + 10
    assert_still_serving_and_nothing_written(hostile, "h-slow")


@pytest.mark.parametrize(
    ("name", "authorization"),
    [
        pytest.param("h-auth-1", f"Bearer {TOKEN}\xa0", id="trailing-nbsp"),
        pytest.param("h-auth-2", f"bearer {TOKEN}\x85", id="trailing-nel"),
        pytest.param("h-auth-3", f"Bearer \xa0{TOKEN}", id="leading-nbsp"),
        pytest.param("h-auth-4", f"Bearer  {TOKEN}", id="two-spaces"),
        pytest.param("h-auth-5", f"Bearer\t{TOKEN}", id="tab"),
    ],
)
def test_a_token_with_extra_whitespace_is_401(
    hostile: Hostile, name: str, authorization: str
) -> None:
    data = request_bytes(
        "POST", f"/sessions/{name}/messages", body=MESSAGE, headers={"Authorization": authorization}
    )
    answer = send_raw(hostile, data, method="POST")
    assert answer.status == 401
    assert answer.error()["code"] == "unauthorized"
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert_still_serving_and_nothing_written(hostile, name)


def test_the_methods_the_worker_answers_still_reach_it(hostile: Hostile) -> None:
    """Every method workerd knows reaches the Worker, which answers OPTIONS, PATCH, PUT,
    DELETE, HEAD or WebDAV's PROPFIND with a 405 and its route's Allow."""
    for method, path, allowed in [
        ("OPTIONS", "/sessions/ok/messages", "POST"),
        ("PATCH", "/sessions/ok/messages", "POST"),
        ("PUT", "/sessions/ok/resume", "POST"),
        ("DELETE", "/sessions/ok/messages", "POST"),
        ("HEAD", "/sessions/ok", "GET, DELETE"),
        # Not one of the SDK's HTTPMethod names: the Worker reads the JS request's own.
        ("PROPFIND", "/sessions/ok", "GET, DELETE"),
        ("MKCOL", "/sessions/ok/messages", "POST"),
    ]:
        answer = send_raw(hostile, request_bytes(method, path), method=method)
        assert (answer.status, answer.headers["allow"]) == (405, allowed), method
        if method != "HEAD":
            assert answer.error()["code"] == "method-not-allowed"
        assert not answer.closed


def test_the_log_has_a_line_for_each_refusal(hostile: Hostile) -> None:
    send_raw(hostile, request_bytes("TRACE", "/sessions/h-log"))
    hostile.server.wait_for_line(r"^TRACE /sessions/h-log 405 Method Not Allowed \(\d+ms\)$")
