"""What the Worker talks to, faked on 127.0.0.1, and a handle on a running dev server.

- `FakeServices`: one HTTP server holding three fakes: an OpenAI-compatible
  LLM (`/v1/chat/completions`) that answers from the conversation it is sent
  (get_issue -> post_slack -> final text; after a tool-durability-error, a
  final text that does not post again), with `"stream": true` as server-sent
  events (the text word by word and the call in pieces, `chunk_delay` seconds
  apart, usage last, then `data: [DONE]`), an issue tracker (`/api/issues/{id}`;
  `issue_bodies[id]` replaces an issue's answer with raw bytes) and a Slack
  webhook (`/hook`) that records every post and can hold its answer until
  released.
- `PaymentsAPI`: the payments API the refunds example (examples/refunds/agent.py)
  talks to: `GET /orders/{id}` and `POST /refunds`, every refund request recorded
  with its headers, its answer held until released when asked to.
- `DevServer`: `scripts/dev` (`wrangler dev` on real workerd) on a free port with
  its own state dir (the shipped `durable_agents.testing.worker.DevWorker`, whose
  child gets none of the developer's settings), serving an agent module given by
  path (`--agent`; the triage example by default, never the template's
  src/agent.py, which is the user's to replace); `crash()` SIGKILLs its process
  group (wrangler and workerd with it), `stop()` ends it with SIGTERM.
- `wrangler()` and `d1_query()`: the project's wrangler as the dev server runs it
  (scripts/wrangler: the pinned Node 22 of runtime/node, runtime/workerd), reading
  the D1 state a dev server keeps (`<state>/v3/d1/`).
- `read_history()`: a session's whole history through the pages of `GET /sessions/{name}`;
  `append_turns()` makes a session long, writing into the running server's local D1.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.served_worker import runtime_module

from durable_agents import Message, ToolCall, Usage
from durable_agents.stores import sqlite_store
from durable_agents.testing.worker import DevWorker

PROJECT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0  # a start takes 10-15 s; far longer on a busy machine
TRIAGE_AGENT = PROJECT / "examples" / "triage" / "agent.py"
REFUNDS_AGENT = PROJECT / "examples" / "refunds" / "agent.py"
DURABILITY_REPLY = "The post may already have gone out; I will not post again. Check #triage."


def durable_object_id(name: str, namespace: str = "durable-agents-AgentSession") -> str:
    """The id `SESSIONS.idFromName(name)` gives under `wrangler dev` (`namespace`: its
    unique key in miniflare, `<worker name>-<class name>`; see the dev server's
    `local_object_id`)."""
    return str(runtime_module("dev").local_object_id(namespace, name))


def read_history(get: Callable[[str], Any], name: str, limit: int | None = None) -> list[Any]:
    """Every stored message of session `name`, in order, through the pages of
    `GET /sessions/{name}` (`get(path)` answers a page's JSON body, a 200's): each page
    starts where the page before said (`next`), each message's `position` is the next
    one, and is dropped, so a message reads as stored (an SSE `message` event's data)."""
    messages: list[Any] = []
    after = None
    while True:
        query = [f"after={after}"] if after is not None else []
        query += [f"limit={limit}"] if limit is not None else []
        page = get(f"/sessions/{name}" + ("?" + "&".join(query) if query else ""))
        assert page["messages"], page  # a page that says there is a next is never empty
        for message in page["messages"]:
            assert message.pop("position") == len(messages), (len(messages), message)
            messages.append(message)
        assert page["message_count"] >= len(messages)
        after = page["next"]
        if after is None:
            return messages
        assert after == len(messages) - 1


def append_turns(worker: DevWorker, session_id: str, turns: int) -> int:
    """Append `turns` triage turns of five messages each to the session (D1-stored, in the
    running server's local D1, as the kit appends them); its message count after."""
    (database,) = [
        f for f in glob.glob(str(worker.state_dir / "v3/d1/miniflare-D1DatabaseObject/*.sqlite"))
        if not f.endswith("metadata.sqlite")
    ]  # fmt: skip

    async def append() -> int:
        store = sqlite_store(database)
        try:
            info = await store.get_session(session_id)
            assert info is not None
            at = info.message_count
            for n in range(turns):
                calls = [
                    ToolCall(f"g{n}", "get_issue", {"id": str(n)}),
                    ToolCall(f"p{n}", "post_slack", {"channel": "#t", "text": f"<b>{n}"}),
                ]
                at = await store.append_messages_atomic(session_id, at, [
                    Message.user(f"triage issue {n}"),
                    Message.assistant("Looking.", calls, usage=Usage(30, 4)),
                    Message.tool_result(calls[0], json.dumps({"id": str(n), "title": "x" * 200})),
                    Message.tool_result(calls[1], '{"ok": true}'),
                    Message.assistant(f"Triaged issue {n}.", usage=Usage(40, 5)),
                ])  # fmt: skip
            return at
        finally:
            await store.close()

    # In a thread of its own: Playwright's sync API may already run a loop in this one.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, append()).result()


class FakeServices:
    def __init__(self) -> None:
        self.llm_requests: list[dict[str, Any]] = []
        self.posts: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.issue_bodies: dict[str, bytes] = {}
        self.hold_posts = False
        self.chunk_delay = 0.0  # seconds between a streamed answer's chunks
        self.post_received = threading.Event()
        self.release_posts = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset(self) -> None:
        """As new for the next test on a shared server: no post recorded, none held."""
        self.posts.clear()
        self.hold_posts = False
        self.post_received.clear()
        self.release_posts.clear()

    def worker_env(self) -> dict[str, str]:
        return {
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": f"{self.url}/v1",
            "LLM_MODEL": "fake-triage",
            "ISSUES_API_URL": f"{self.url}/api",
            "SLACK_WEBHOOK_URL": f"{self.url}/hook",
        }

    def __enter__(self) -> FakeServices:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_posts.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.llm_requests.append(body)
        return _completion(*_next_move(body["messages"]))

    def chat_chunks(self, body: dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
        """`chat`'s answer (a subclass's too) as the `chat.completion.chunk`s of a stream;
        an answer that is not a completion (an error object) as it is."""
        completion = self.chat(body)
        if not completion.get("choices"):
            return completion
        return _completion_chunks(completion)

    def post(self, headers: dict[str, str], body: dict[str, Any]) -> None:
        with self._lock:
            self.posts.append((headers, body))
        if self.hold_posts:
            self.post_received.set()
            self.release_posts.wait(60)


def _next_move(messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    """The fake model's move for the current turn: (text, tool call or None)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    turn = messages[last_user:]
    names = {
        call["id"]: call["function"]["name"]
        for m in turn
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = {names.get(m["tool_call_id"]): m["content"] for m in turn if m["role"] == "tool"}
    issue = re.search(r"\d+", turn[0]["content"])
    issue_id = issue.group() if issue else "1"
    if "post_slack" in results:
        if "tool-durability-error" in results["post_slack"]:
            return DURABILITY_REPLY, None
        return f"Triaged issue {issue_id} and posted to #triage.", None
    if "get_issue" in results:
        title = json.loads(results["get_issue"]).get("title", "?")
        post = {"channel": "#triage", "text": title}
        return "Posting.", {"name": "post_slack", "arguments": post}
    return "Looking it up.", {"name": "get_issue", "arguments": {"id": issue_id}}


def _completion(text: str, call: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if call is not None:
        message["tool_calls"] = [
            {
                "id": f"call_{time.monotonic_ns()}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake-triage",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if call else "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _completion_chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """A `chat.completion` as a stream sends it (with `include_usage`): the role, the
    text word by word, each call's id and name then its arguments in two pieces, the
    finish reason, and the usage in a last chunk without choices."""
    message = completion["choices"][0]["message"]
    text, calls = message.get("content") or "", message.get("tool_calls") or []

    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
        choices = [] if delta is None else [
            {"index": 0, "delta": delta, "finish_reason": finish}
        ]  # fmt: skip
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": "fake-triage", "choices": choices, "usage": None}  # fmt: skip

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": word}) for word in re.findall(r"\S+\s*", text)]
    for index, call in enumerate(calls):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        start = {"index": index, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
        chunks.append(chunk({"tool_calls": [start]}))
        for piece in (arguments[:half], arguments[half:]):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            chunks.append(chunk(delta))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    last = chunk(None)
    last["usage"] = completion.get("usage")
    chunks.append(last)
    return chunks


def _handler_for(services: FakeServices) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._raw(status, json.dumps(body).encode())

        def _raw(self, status: int, data: bytes) -> None:
            # The dev server may be gone by now (the crash test kills it mid-post).
            with contextlib.suppress(OSError):
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("content-length") or 0)
            return json.loads(self.rfile.read(length) or b"null")

        def do_GET(self) -> None:
            match = re.fullmatch(r"/api/issues/([^/]+)", self.path)
            if match is None:
                self._json(404, {"error": "not found"})
                return
            issue = match.group(1)
            raw = services.issue_bodies.get(issue)
            if raw is not None:
                self._raw(200, raw)
                return
            self._json(200, {"id": issue, "title": f"Login fails ({issue})", "status": "open"})

        def _events(self, chunks: list[dict[str, Any]]) -> None:
            # Chunked, each event flushed on its own, `chunk_delay` apart.
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
                for number, event in enumerate([*events, b"data: [DONE]\n\n"]):
                    if number and services.chunk_delay:
                        time.sleep(services.chunk_delay)
                    self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/v1/chat/completions" and body.get("stream") is True:
                answer = services.chat_chunks(body)
                if isinstance(answer, list):
                    self._events(answer)
                else:
                    self._json(200, answer)
            elif self.path == "/v1/chat/completions":
                self._json(200, services.chat(body))
            elif self.path == "/hook":
                services.post({k.lower(): v for k, v in self.headers.items()}, body)
                self._json(200, {"ok": True})
            else:
                self._json(404, {"error": "not found"})

    return Handler


class PaymentsAPI:
    """A payments API on 127.0.0.1 for the refunds example. Every order was paid 49.99:
    `GET /orders/{id}` answers it with what is already refunded of it (counted in
    `order_reads`). `POST /refunds` records each request, (lower-cased headers, JSON
    body), in `refund_requests`; a repeated Idempotency-Key gets the first refund back
    and refunds nothing more. With `hold` set, a refund's answer waits for `release`
    (the API got the request, sets `received`, and refunded; the Worker has no answer
    yet); a read of an order in `hold_reads` waits for `release` too, after setting
    `read_received[order_id]`. Any other path is 404."""

    AMOUNT_CENTS = 4999

    def __init__(self) -> None:
        self.refund_requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.refunds: dict[str, dict[str, Any]] = {}  # by Idempotency-Key
        self.order_reads = 0
        self.hold = False
        self.hold_reads: set[str] = set()
        self.read_received: dict[str, threading.Event] = {}
        self.received = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _payments_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def refunds_keyed(self, key: str) -> int:
        """How many refund requests carried the Idempotency-Key `key`."""
        with self._lock:
            keys = [headers.get("idempotency-key") for headers, _ in self.refund_requests]
        return keys.count(key)

    def __enter__(self) -> PaymentsAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def order(self, order_id: str) -> dict[str, Any]:
        if order_id in self.hold_reads:
            self.read_received.setdefault(order_id, threading.Event()).set()
            self.release.wait(60)
        with self._lock:
            self.order_reads += 1
            refunded = sum(
                r["amount_cents"] for r in self.refunds.values() if r["order_id"] == order_id
            )
        return {"id": order_id, "amount_cents": self.AMOUNT_CENTS, "currency": "usd",
                "status": "paid", "refunded_cents": refunded}  # fmt: skip

    def refund(self, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        key = headers.get("idempotency-key", "")
        with self._lock:
            self.refund_requests.append((headers, body))
            refund = self.refunds.setdefault(
                key or f"no-key-{len(self.refunds)}",
                {"id": f"re_{len(self.refunds) + 1}", "order_id": body.get("order_id"),
                 "amount_cents": body.get("amount_cents"), "status": "succeeded"},
            )  # fmt: skip
        if self.hold:
            self.received.set()
            self.release.wait(60)
        return refund


def _payments_handler(api: PaymentsAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def handle(self) -> None:
            with contextlib.suppress(ConnectionError):  # the killed Worker's connection
                super().handle()

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            with contextlib.suppress(OSError):  # the Worker may be dead by now
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:
            match = re.fullmatch(r"/orders/([^/]+)", self.path)
            if match is None:
                self._json(404, {"error": "not found"})
                return
            self._json(200, api.order(match.group(1)))

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/refunds":
                self._json(404, {"error": "not found"})
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            self._json(200, api.refund(headers, body))

    return Handler


class _Worker(DevWorker):
    """A DevWorker whose .dev.vars file holds exactly the text a test gives."""

    raw_dev_vars = ""

    def dev_vars_text(self) -> str:
        return self.raw_dev_vars


class DevServer:
    """`scripts/dev` on a free port, with its own state dir and .dev.vars file
    (`dev_vars`, its text; none by default), serving the agent module `agent`;
    settings (`env`) go into its environment. The shipped `DevWorker` underneath
    (`worker`), in the shape these tests use: `request` answers (status, headers,
    JSON body), `crash()` is `kill()`, `kill_all()` is `close()`."""

    def __init__(
        self, state_dir: Path, env: dict[str, str], dev_vars: str = "",
        agent: Path = TRIAGE_AGENT,
    ) -> None:  # fmt: skip
        self.env = env
        self.worker = _Worker(
            PROJECT, state_dir, agent=agent, env=env, start_timeout=START_TIMEOUT_S
        )
        self.worker.raw_dev_vars = dev_vars

    state_dir = property(lambda self: self.worker.state_dir)
    url = property(lambda self: self.worker.url)
    lines = property(lambda self: self.worker.lines)
    start_s = property(lambda self: self.worker.start_s)
    process = property(lambda self: self.worker.process)

    def start(self) -> DevServer:
        self.worker.start()
        return self

    def wait_for_line(self, pattern: str, timeout: float = 10) -> str:
        """The first output line matching `pattern` (a regex), waiting for it to be printed."""
        return self.worker.wait_for_line(pattern, timeout)

    def request(
        self, method: str, path: str, body: bytes | None = None, *,
        token: str | None = "test-token", headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> tuple[int, dict[str, str], Any]:  # fmt: skip
        """(status, headers, JSON body) of one request; `token=None` sends no Authorization."""
        answer = self.worker.request(
            method, path, body, headers=headers, token=token or "", timeout=timeout
        )
        return answer.status, dict(answer.headers), answer.body

    def crash(self) -> None:
        """SIGKILL the dev server process (a crash: no cleanup runs)."""
        self.worker.kill()

    def stop(self) -> None:
        self.worker.stop()

    def kill_all(self) -> None:
        """Kill every process this handle's servers started (workerd included)."""
        self.worker.close()


def wrangler(*args: str, persist_to: Path | None = None) -> str:
    """`wrangler ARGS` in the project as the dev server runs it (scripts/wrangler, by
    DevWorker.wrangler), offline; its stdout. Fails with its output."""
    state = persist_to or PROJECT / ".wrangler" / "state"
    extra = ["--persist-to", str(persist_to)] if persist_to is not None else []
    return DevWorker(PROJECT, state).wrangler(*args, *extra)


def d1_query(sql: str, persist_to: Path) -> list[dict[str, Any]]:
    """Rows of one query on the local D1 database (`DevWorker.rows`: its SQLite file)."""
    return DevWorker(PROJECT, persist_to).rows(sql)


@contextlib.contextmanager
def serving(services: FakeServices, state_dir: Path) -> Iterator[DevServer]:
    """A started dev server whose Worker talks to `services` (API_TOKEN "test-token"),
    every process of it killed on leaving: a module fixture's body."""
    dev = DevServer(state_dir, {**services.worker_env(), "API_TOKEN": "test-token"})
    dev.start()
    try:
        yield dev
    finally:
        dev.kill_all()
