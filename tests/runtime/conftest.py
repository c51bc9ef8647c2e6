"""Every test_*.py here runs INSIDE workerd (Pyodide 314, its D1 and Durable Objects).

See `durable_agents.testing.pytest_plugin`. The fixtures below run on
CPython; their values (JSON) become the in-runtime tests' arguments.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tests.support import d1_checks

from durable_agents.testing import conformance
from durable_agents.testing.pytest_plugin import (  # noqa: F401 - hooks and fixtures for this dir
    pytest_pycollect_makemodule,
    pytest_runtest_makereport,
    pytest_terminal_summary,
    workers_runtime,
)


@pytest.fixture(params=[check.__name__ for check in conformance.CHECKS])
def conformance_check(request: pytest.FixtureRequest) -> str:
    """The name of one store conformance check (run in the runtime by name)."""
    name: str = request.param
    return name


@pytest.fixture(params=[check.__name__ for check in d1_checks.CHECKS])
def d1_check(request: pytest.FixtureRequest) -> str:
    """The name of one D1 binding check (run in the runtime by name)."""
    name: str = request.param
    return name


class _Handler(BaseHTTPRequestHandler):
    """A small HTTP API for the fetch transport tests: echo, gzip, stream, redirect."""

    protocol_version = "HTTP/1.1"  # a chunked body is HTTP/1.1 (workerd's fetch drops it on 1.0)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/gzip":
            body = gzip.compress(b'{"compressed": true}')
            self._reply(200, body, {"content-type": "application/json", "content-encoding": "gzip"})
        elif self.path == "/redirect":
            self._reply(302, b"", {"location": "/echo"})
        elif self.path == "/stream":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for n in range(3):
                chunk = f"data: {n}\n\n".encode()
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._echo()

    def do_POST(self) -> None:
        self._echo()

    def _echo(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        reply = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode(),
        }
        self._reply(
            201,
            json.dumps(reply).encode(),
            {"content-type": "application/json", "set-cookie": "a=1", "x-reply": "yes"},
        )


@pytest.fixture
def local_http_server() -> Iterator[str]:
    """The base URL of an HTTP server on 127.0.0.1, up for one test."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _ChatCompletions(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat server that plays a weather agent from the conversation:
    no tool result yet -> call get_weather; a tool result -> a final answer quoting it."""

    requests: list[dict[str, object]]

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.requests.append({"path": self.path, "auth": self.headers.get("authorization"),
                              "body": body})  # fmt: skip
        last = body["messages"][-1]
        if last["role"] == "tool":
            message = {"role": "assistant", "content": f"The weather: {last['content']}"}
        else:
            function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            call = {"id": "call_w1", "type": "function", "function": function}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        reply = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def openai_server() -> Iterator[dict[str, object]]:
    """A fake OpenAI-compatible server on 127.0.0.1: {"url": base URL ending in /v1}.
    After the test, the requests it got are checked on CPython by the fixture."""
    requests: list[dict[str, object]] = []
    handler = type("Handler", (_ChatCompletions,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"url": f"http://127.0.0.1:{server.server_address[1]}/v1"}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    # What crossed the wire from Pyodide: two chat calls, the second carrying the result.
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 2
    assert all(r["auth"] == "Bearer sk-test" for r in requests)
    second = requests[1]["body"]
    assert isinstance(second, dict)
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["tool_call_id"] == "call_w1"
