"""Odd and hostile requests to `scripts/dev`, sent over raw sockets.

The dev server forwards what the Worker can be given and refuses, with the
Worker's error shape (`{"error": {"code", "message"}}`), what it cannot
forward or what Cloudflare's edge would not: TRACE and CONNECT (405 with
`Allow`), `OPTIONS *` and absolute- or authority-form targets (400), a
declared Content-Length over the limit (413, before any of the body is read),
and a request whose headers or body do not arrive in time (408, the socket
closed). Every one is answered fast, nothing of it reaches the Worker or D1,
and the server goes on serving. The Worker's own bearer check refuses a token
with a trailing no-break space.

One dev server (the fake LLM, issue tracker and webhook of worker_fakes) for
the module, with a short request timeout (DEV_REQUEST_TIMEOUT).
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
from worker_fakes import DevServer, FakeServices, d1_query, durable_object_id

pytestmark = pytest.mark.slow

TOKEN = "test-token"
REQUEST_TIMEOUT_S = 1.5
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
        env = {**services.worker_env(), "DEV_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)}
        server = DevServer(tmp_path_factory.mktemp("hostile"), env, f"API_TOKEN={TOKEN}\n")
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
        sock.settimeout(1)  # a connection kept alive is not closed within 1 s (keepAliveTimeout: 5)
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
    """A normal request right after is answered; the session `name` has no row in D1
    (read by wrangler) and nothing reached the fake LLM or webhook."""
    assert (len(hostile.services.llm_requests), len(hostile.services.posts)) == hostile.calls
    status, _, history = hostile.server.request("GET", "/sessions/ok", timeout=10)
    assert status == 200, history
    assert history["messages"][0]["role"] == "user"
    status, _, reply = hostile.server.request("GET", f"/sessions/{name}", timeout=10)
    assert (status, reply["error"]["code"]) == (404, "session-not-found")
    session_id = durable_object_id(name)
    sql = (
        f"SELECT (SELECT COUNT(*) FROM agent_messages WHERE session_id = '{session_id}') AS m,"
        f" (SELECT COUNT(*) FROM agent_sessions WHERE id = '{session_id}') AS s"
    )
    assert d1_query(sql, hostile.server.state_dir) == [{"m": 0, "s": 0}]


def test_trace_is_405_with_allow(hostile: Hostile) -> None:
    answer = send_raw(hostile, request_bytes("TRACE", "/sessions/h-trace/messages"))
    assert answer.status == 405
    assert answer.error()["code"] == "method-not-allowed"
    assert "POST" in answer.headers["allow"]
    assert "TRACE" not in answer.headers["allow"]
    assert answer.seconds < 1
    assert_still_serving_and_nothing_written(hostile, "h-trace")


def test_connect_is_405_with_allow(hostile: Hostile) -> None:
    data = request_bytes("CONNECT", "evil.example:443", headers={"Host": "evil.example:443"})
    answer = send_raw(hostile, data, method="CONNECT")
    assert answer.status == 405
    assert answer.error()["code"] == "method-not-allowed"
    assert "CONNECT" not in answer.headers["allow"]
    assert answer.closed
    assert answer.seconds < 1
    assert_still_serving_and_nothing_written(hostile, "h-connect")


def test_options_asterisk_is_400(hostile: Hostile) -> None:
    answer = send_raw(hostile, request_bytes("OPTIONS", "*"))
    assert answer.status == 400
    assert answer.error()["code"] == "invalid-request"
    assert answer.seconds < 1
    assert_still_serving_and_nothing_written(hostile, "h-options")


@pytest.mark.parametrize(
    "target",
    [
        "http://evil.example/sessions/h-absolute/messages",
        "http://127.0.0.1/sessions/h-absolute/messages",
        "evil.example:443",
    ],
)
def test_absolute_and_authority_form_targets_are_400(hostile: Hostile, target: str) -> None:
    data = request_bytes("POST", target, body=MESSAGE, headers={"Host": "evil.example"})
    answer = send_raw(hostile, data, method="POST")
    assert answer.status == 400
    assert answer.error()["code"] == "invalid-request"
    assert answer.seconds < 1
    assert_still_serving_and_nothing_written(hostile, "h-absolute")


def test_a_huge_declared_length_is_413_before_any_body_is_read(hostile: Hostile) -> None:
    data = request_bytes(
        "POST", "/sessions/h-huge/messages", headers={"Content-Length": "1000000000000000"}
    )
    answer = send_raw(hostile, data, method="POST")
    assert answer.status == 413
    assert answer.error()["code"] == "body-too-large"
    assert answer.closed  # the unread body is not taken for the next request
    assert answer.seconds < 1
    assert_still_serving_and_nothing_written(hostile, "h-huge")


def test_expect_100_continue_with_a_huge_length_is_413_without_a_100(hostile: Hostile) -> None:
    data = request_bytes(
        "POST",
        "/sessions/h-expect/messages",
        headers={"Content-Length": "1000000000000000", "Expect": "100-continue"},
    )
    with socket.create_connection(hostile.address, timeout=10) as sock:
        sock.sendall(data)
        assert sock.recv(12) == b"HTTP/1.1 413"
    assert_still_serving_and_nothing_written(hostile, "h-expect")


def test_expect_100_continue_gets_a_100_then_the_turn_runs(hostile: Hostile) -> None:
    data = request_bytes(
        "POST", "/sessions/expected/messages", body=MESSAGE, headers={"Expect": "100-continue"}
    )
    headers, body = data[: -len(MESSAGE)], MESSAGE
    with socket.create_connection(hostile.address, timeout=30) as sock:
        sock.sendall(headers)
        assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        reply = json.loads(response.read())
    assert response.status == 200, reply
    assert reply["session_id"] == durable_object_id("expected")


def test_an_unknown_method_is_400(hostile: Hostile) -> None:
    answer = send_raw(hostile, request_bytes("TRACK", "/sessions/h-track/messages"))
    assert answer.status == 400
    assert answer.error()["code"] == "invalid-request"
    assert answer.closed
    assert_still_serving_and_nothing_written(hostile, "h-track")


def test_a_body_declared_but_never_sent_is_408_and_the_socket_closed(hostile: Hostile) -> None:
    data = request_bytes(
        "POST", "/sessions/h-nobody/messages", headers={"Content-Length": str(len(MESSAGE))}
    )
    answer = send_raw(hostile, data + MESSAGE[:10], method="POST")
    assert answer.status == 408
    assert answer.error()["code"] == "request-timeout"
    assert answer.closed
    assert REQUEST_TIMEOUT_S - 0.1 < answer.seconds < REQUEST_TIMEOUT_S + 3
    assert_still_serving_and_nothing_written(hostile, "h-nobody")


def test_headers_never_finished_are_408_and_the_socket_closed(hostile: Hostile) -> None:
    data = request_bytes("POST", "/sessions/h-slow/messages", body=MESSAGE)
    answer = send_raw(hostile, data[: data.index(b"\r\n\r\n")], method="POST")
    assert answer.status == 408
    assert answer.error()["code"] == "request-timeout"
    assert answer.closed
    assert answer.seconds < REQUEST_TIMEOUT_S + 3
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
    """The dev server refuses only what it cannot forward: the Worker itself answers
    OPTIONS, PATCH, PUT, DELETE or HEAD, with a 405 and its route's Allow."""
    for method, path, allowed in [
        ("OPTIONS", "/sessions/ok/messages", "POST"),
        ("PATCH", "/sessions/ok/messages", "POST"),
        ("PUT", "/sessions/ok/resume", "POST"),
        ("DELETE", "/sessions/ok/messages", "POST"),
        ("HEAD", "/sessions/ok", "GET, DELETE"),
        # Not one of the SDK's HTTPMethod names: the Worker reads the JS request's own.
        ("PROPFIND", "/sessions/ok", "GET, DELETE"),
        ("M-SEARCH", "/sessions/ok/messages", "POST"),
    ]:
        answer = send_raw(hostile, request_bytes(method, path), method=method)
        assert (answer.status, answer.headers["allow"]) == (405, allowed), method
        if method != "HEAD":
            assert answer.error()["code"] == "method-not-allowed"
        assert not answer.closed


def test_the_log_has_a_line_for_each_refusal(hostile: Hostile) -> None:
    send_raw(hostile, request_bytes("TRACE", "/sessions/h-log"))
    hostile.server.wait_for_line(r"^TRACE /sessions/h-log 405 \d+ms$")
