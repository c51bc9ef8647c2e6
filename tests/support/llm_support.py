"""Shared by the LLM adapter tests: strict wire validators, a real local HTTP server,
a fast retry policy, and sample conversations."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from pydantic import TypeAdapter
from pydantic_core import SchemaValidator

from durable_agents import Message, ToolCall, ToolSpec
from durable_agents.llm import RetryPolicy

# ---------------------------------------------------------------- wire validation


def strict_validator(tp: Any) -> SchemaValidator:
    """A validator for an SDK request TypedDict that rejects anything the SDK does not declare.

    pydantic ignores unknown keys of a TypedDict and validates `Iterable[...]`
    lazily, so `TypeAdapter(tp).validate_python` alone would let a misspelt key
    or a bad nested block through. This rewrites the SDK's own schema: every
    TypedDict and model forbids extra keys (unless the SDK explicitly allows
    them, as for a tool's JSON schema), and iterables are checked eagerly.
    """
    schema = copy.deepcopy(TypeAdapter(tp).core_schema)

    def tighten(node: Any) -> None:
        if isinstance(node, dict):
            kind = node.get("type")
            allows_extra = node.get("extra_behavior") == "allow"
            if kind in ("typed-dict", "model-fields") and not allows_extra:
                node["extra_behavior"] = "forbid"
            elif kind == "model":
                node.setdefault("config", {})["extra_fields_behavior"] = "forbid"
            elif kind == "generator":
                node["type"] = "list"
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    return SchemaValidator(schema)


def _anthropic_validator(streaming: bool) -> SchemaValidator:
    from anthropic.types.message_create_params import (
        MessageCreateParamsNonStreaming,
        MessageCreateParamsStreaming,
    )

    return strict_validator(
        MessageCreateParamsStreaming if streaming else MessageCreateParamsNonStreaming
    )


def _openai_validator(streaming: bool) -> SchemaValidator:
    from openai.types.chat.completion_create_params import (
        CompletionCreateParamsNonStreaming,
        CompletionCreateParamsStreaming,
    )

    return strict_validator(
        CompletionCreateParamsStreaming if streaming else CompletionCreateParamsNonStreaming
    )


_validators: dict[tuple[str, bool], SchemaValidator] = {}


def validate_request(provider: str, body: dict[str, Any]) -> None:
    """Raise pydantic's ValidationError unless `body` fits the official SDK's request type
    (the SDK's streaming request type when the body has `"stream": true`)."""
    key = (provider, body.get("stream") is True)
    if key not in _validators:
        _validators[key] = (
            _anthropic_validator(key[1]) if provider == "anthropic" else _openai_validator(key[1])
        )
    _validators[key].validate_python(body, strict=True)


# ---------------------------------------------------------------- retry policy


class RecordingSleep:
    """An async sleep that records the waits and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def fast_retry(
    max_attempts: int = 4, sleep: RecordingSleep | None = None, deadline: float = 30.0
) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=max_attempts,
        base_delay=0.001,
        max_delay=0.01,
        deadline=deadline,
        sleep=sleep or RecordingSleep(),
        random=lambda: 0.5,
    )


# ---------------------------------------------------------------- a real HTTP server


@dataclass
class Reply:
    """One scripted answer: a status and JSON body, or a dropped connection, maybe late.

    With `events`, a server-sent event stream instead: each event written and
    flushed on its own, chunked (or, with `chunked=False`, ended by closing
    the connection). `cut_after=n` sends n events and drops the connection
    (mid-body); `hold_after=n` sends n events, then waits for the server's
    `release` before the rest.
    """

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    raw: bytes | None = None
    events: list[bytes] | None = None
    chunked: bool = True
    cut_after: int | None = None
    hold_after: int | None = None


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    size: int = 0  # bytes of the body as sent


class ScriptedServer:
    """A real HTTP server on 127.0.0.1 that answers from a script, one reply per request.

    Plays the provider: it records every request (path, lower-cased headers,
    decoded JSON body, its size) and fails loudly (HTTP 599, and `exhausted`
    set) when its script runs out. With `answer`, every reply is
    `answer(body)` instead (a model that reads what it is sent).
    """

    def __init__(self, replies: list[Reply], answer: Callable[[Any], Reply] | None = None) -> None:
        self.replies = list(replies)
        self.answer = answer
        self.requests: list[Recorded] = []
        self.exhausted = False
        self.release = threading.Event()  # lets a held stream go on
        self.stream_ended = threading.Event()  # a stream's last event was written
        self._lock = threading.Lock()
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                with server._lock:
                    server.requests.append(
                        Recorded(
                            "POST",
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            len(raw),
                        )
                    )
                    if server.answer is not None:
                        reply = server.answer(body)
                    else:
                        reply = server.replies.pop(0) if server.replies else None
                if reply is None:
                    server.exhausted = True
                    reply = Reply({"error": {"message": "script exhausted"}}, status=599)
                if reply.delay:
                    server._release.wait(reply.delay)
                if reply.drop:
                    self.close_connection = True
                    return
                if reply.events is not None:
                    self.send_events(reply)
                    return
                payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    if "content-type" not in reply.headers:
                        self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up (a timeout test)
                    self.close_connection = True

            def send_events(self, reply: Reply) -> None:
                assert reply.events is not None
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "text/event-stream; charset=utf-8")
                    self.send_header("cache-control", "no-cache")
                    if reply.chunked:
                        self.send_header("transfer-encoding", "chunked")
                    else:
                        self.send_header("connection", "close")
                        self.close_connection = True
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.flush()
                    for number, event in enumerate(reply.events):
                        if number == reply.cut_after:
                            self.close_connection = True
                            return
                        if number == reply.hold_after:
                            server.release.wait(10)
                        frame = f"{len(event):x}\r\n".encode() + event + b"\r\n"
                        self.wfile.write(frame if reply.chunked else event)
                        self.wfile.flush()
                    if reply.chunked:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    server.stream_ended.set()
                except OSError:  # the client went away
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._release.set()
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# ---------------------------------------------------------------- conversations

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
POST_SLACK = ToolSpec(
    "post_slack",
    "Post a message to a Slack channel.",
    {
        "type": "object",
        "properties": {"channel": {"type": "string"}, "text": {"type": "string"}},
        "required": ["channel", "text"],
    },
)
TOOLS = [WEATHER, POST_SLACK]

PARIS = ToolCall("call_1", "get_weather", {"city": "Paris"})
ROME = ToolCall("call_2", "get_weather", {"city": "Rome"})
POST = ToolCall("call_3", "post_slack", {"channel": "#ops", "text": "Paris: sunny"})
ERROR_CONTENT = json.dumps({"error": "Tool 'post_slack' failed: timeout", "kind": "tool-failed"})


def conversations() -> dict[str, tuple[list[Message], list[ToolSpec]]]:
    """Each shape a conversation can take, as the run loop sends it."""
    system = Message.system("You are a weather assistant.")
    ask = Message.user("Weather in Paris and Rome? Then post Paris to #ops.")
    return {
        "text only": ([system, Message.user("Hello")], []),
        "no system prompt": ([Message.system(""), Message.user("Hello")], []),
        "with tools": ([system, ask], TOOLS),
        "tool call and result": (
            [
                system,
                ask,
                Message.assistant("Let me check.", [PARIS]),
                Message.tool_result(PARIS, '{"temp_c": 21, "sky": "sunny"}'),
            ],
            TOOLS,
        ),
        "parallel calls without text": (
            [
                system,
                ask,
                Message.assistant("", [PARIS, ROME]),
                Message.tool_result(PARIS, '{"temp_c": 21}'),
                Message.tool_result(ROME, '{"temp_c": 25}'),
            ],
            TOOLS,
        ),
        "error result": (
            [
                system,
                ask,
                Message.assistant("", [POST]),
                Message.tool_result(POST, ERROR_CONTENT),
            ],
            TOOLS,
        ),
        "full history, next turn": (
            [
                system,
                ask,
                Message.assistant("Checking both.", [PARIS, ROME]),
                Message.tool_result(PARIS, '{"temp_c": 21}'),
                Message.tool_result(ROME, "plain text result"),
                Message.assistant("", [POST]),
                Message.tool_result(POST, ERROR_CONTENT),
                Message.assistant("Paris 21 C, Rome 25 C; posting failed."),
                Message.user("Try posting again."),
            ],
            TOOLS,
        ),
    }


def capture_transport(answer: Callable[[Any], Any]) -> tuple[httpx.MockTransport, list[Any]]:
    """An httpx.MockTransport that records each request's (request, JSON body) and
    answers with the JSON `answer(body)` returns."""
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request, body))
        return httpx.Response(200, json=answer(body))

    return httpx.MockTransport(handler), seen


# ---------------------------------------------------------------- server-sent events


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: `event:` (if named) and `data:` (JSON unless bytes/str)."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return (head + f"data: {text}\n\n").encode()
