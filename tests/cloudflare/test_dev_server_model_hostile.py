"""A hostile OpenAI-compatible model, over HTTP against `scripts/dev` (real workerd).

The CPython version of these cases is tests/test_model_hostile.py. Here the
refunds example (examples/refunds/agent.py: `lookup_order` a safe read,
`issue_refund` approval-gated) talks to a fake model on 127.0.0.1 that
answers with what no well-behaved model sends: call ids no URL carries, NaN
and Infinity in arguments, lone surrogates (`\\ud800` escapes in its raw
bytes), a reply over the 1.9 MB a stored message may hold, an answer held
until the test releases it. Each case leaves a session that takes its next
message, a history a strict JSON parser reads (UTF-8 decoded strictly, no
NaN, no infinity, no lone surrogate), the user's message kept, and no 500.
Also: an approval posted after the session was deleted, and a session token
whose expiry was rewritten with a leading zero.

The fake model decides its move from the turn's user message, `"<scenario>
<session>"`, so each test has its own sessions and runs in any order. One
dev server for the module.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from tests.support.worker_fakes import FakeServices, PaymentsAPI, read_history

from durable_agents.messages import CALL_ID
from durable_agents.testing.worker import DevWorker, EventStream, find_project

pytestmark = pytest.mark.slow
REFUNDS = "examples/refunds/agent.py"
SECRET = "s" * 40  # SESSION_TOKEN_SECRET: at least 32 bytes
ODD_IDS = ["a/b", "a b", "café", "x" * 300, "..", "%41", "a\nb"]
# `function.arguments` as the model's raw JSON text: no strict parser reads these numbers.
NON_FINITE = [
    f'{{"order_id": "A-1", "extra": {number}}}'
    for number in ("NaN", "Infinity", "-Infinity", "1e400")
]
HUGE_CHARS = 2_000_000


class HostileModel(FakeServices):
    """FakeServices whose model plays the scenario its turn's user message names.

    Its answers are dicts the fake's handler writes with `json.dumps` (ASCII
    escapes): a lone surrogate in a str goes out as the six bytes `\\ud800`,
    NaN inside an arguments string as the three bytes `NaN`, as a model would
    send them. `held` is set when a `hold` turn's call arrives; it answers once
    `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.served: set[str] = set()  # the turns (user messages) answered once already
        self.held = threading.Event()
        self.release = threading.Event()

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        super().__exit__(*exc)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.llm_requests.append(body)
        messages = body["messages"]
        start = max(i for i, m in enumerate(messages) if m["role"] == "user")
        ask = messages[start]["content"]
        answered = any(m["role"] == "tool" for m in messages[start:])
        with self._lock:
            first = ask not in self.served
            self.served.add(ask)
        scenario = ask.split(" ", 1)[0]
        if answered:  # a lone surrogate in the final text only where the scenario is them
            lone = " \udc00" if scenario.startswith("surrogate") else ""
            return completion(f"done{lone} with {scenario}")
        if scenario == "odd-ids":
            calls = [call(i, "lookup_order", {"order_id": f"O{n}"}) for n, i in enumerate(ODD_IDS)]
            return completion("Looking them up.", calls)
        if scenario == "odd-gated":
            return completion("Refunding.", [
                call(i, "issue_refund", {"order_id": f"O{n}", "amount_cents": 100, "reason": "r"})
                for n, i in enumerate(ODD_IDS)
            ])  # fmt: skip
        if scenario == "gated":
            return completion("Refunding.", [call("c1", "issue_refund",
                {"order_id": "O1", "amount_cents": 100, "reason": "r"})])  # fmt: skip
        if scenario == "non-finite":
            calls = [
                {"id": f"{tool}{n}", "type": "function",
                 "function": {"name": tool, "arguments": raw.replace("A-1", f"A-{n}")}}
                for tool in ("lookup_order", "issue_refund") for n, raw in enumerate(NON_FINITE)
            ]  # fmt: skip
            return completion("Trying.", calls)
        if scenario in ("surrogate", "surrogate-stream"):
            # A lone surrogate escaped in the response's JSON (s1: `\ud800` in the
            # arguments string) and in the arguments' own JSON (s2: `\\ud800` there).
            calls = [
                {"id": "s1", "type": "function",
                 "function": {"name": "lookup_order", "arguments": '{"order_id": "A-\ud800"}'}},
                {"id": "s2", "type": "function",
                 "function": {"name": "lookup_order", "arguments": '{"order_id": "B-\\ud800"}'}},
            ]  # fmt: skip
            return completion("hi \ud800 there", calls)
        if scenario == "huge" and first:
            return completion("y" * HUGE_CHARS)
        if scenario == "hold" and first:
            self.held.set()
            self.release.wait(60)
            return completion("released")
        return completion(f"ok: {scenario}")


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def completion(text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
    return {"id": "chatcmpl-hostile", "object": "chat.completion", "model": "fake",
            "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}  # fmt: skip


@pytest.fixture(scope="module")
def model() -> Iterator[HostileModel]:
    with HostileModel() as fake:
        yield fake


@pytest.fixture(scope="module")
def worker(
    model: HostileModel, payments: PaymentsAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevWorker]:
    settings = {
        "LLM_PROVIDER": "openai", "LLM_BASE_URL": f"{model.url}/v1", "LLM_MODEL": "fake",
        "PAYMENTS_API_URL": payments.url, "SESSION_TOKEN_SECRET": SECRET,
    }  # fmt: skip
    state = tmp_path_factory.mktemp("model-hostile-dev-worker")
    with DevWorker(find_project(Path(__file__).parent), state, settings, agent=REFUNDS) as dev:
        yield dev


# -- strict reading of what the Worker answers ---------------------------------------------


def strict_json(raw: bytes) -> Any:
    """`raw` as a strict parser reads it: UTF-8 (strictly), RFC 8259 numbers only, and no
    string holding a lone surrogate (a `\\ud800` escape no UTF-8 text can carry)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in an answer")

    def finite(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise ValueError(f"{literal} in an answer")
        return value

    value = json.loads(raw.decode("utf-8"), parse_constant=refuse, parse_float=finite)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return value


def call_api(
    worker: DevWorker, method: str, path: str, body: Any = None, *, token: str | None = None
) -> tuple[int, Any]:
    """(status, body read by `strict_json`) of one request; `token` replaces the API token."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"authorization": f"Bearer {token or worker.token}"}
    if data is not None:
        headers["content-type"] = "application/json"
    request = urllib.request.Request(worker.url + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, strict_json(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, strict_json(error.read())


def strict_events(stream: EventStream) -> list[tuple[str, Any]]:
    """The (event, data) of a whole SSE answer, its bytes read by `strict_json`."""
    assert stream.status == 200, stream.json()
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in stream.response.read().split(b"\n\n"):
        fields = dict(line.split(b": ", 1) for line in block.splitlines() if b": " in line)
        if b"data" in fields:
            events.append((fields.get(b"event", b"message").decode(), strict_json(fields[b"data"])))
    return events


def history(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    def get(path: str) -> Any:
        status, body = call_api(worker, "GET", path)
        assert status == 200, body
        return body

    return read_history(get, name)


def turn(worker: DevWorker, name: str, scenario: str, status: int = 200) -> dict[str, Any]:
    """POST `"<scenario> <name>"` to session `name`; its answer, of HTTP status `status`."""
    got, body = call_api(
        worker, "POST", f"/sessions/{name}/messages", {"message": f"{scenario} {name}"}
    )
    assert got == status, body
    answer: dict[str, Any] = body
    return answer


def takes_a_next_message(worker: DevWorker, name: str) -> None:
    answer = turn(worker, name, "next")
    assert (answer["status"], answer["response"]) == ("complete", "ok: next")


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


def sent_after_results(model: HostileModel, ask: str) -> dict[str, Any]:
    """The last LLM request of the turn `ask` that carried tool results."""
    return next(
        r for r in reversed(model.llm_requests)
        if any(m["role"] == "user" and m["content"] == ask for m in r["messages"])
        and r["messages"][-1]["role"] == "tool"
    )  # fmt: skip


def provider_ids_sent(request: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The call ids of the request's last assistant message and of the tool messages after it."""
    messages = request["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    calls = [c["id"] for c in messages[last]["tool_calls"]]
    return calls, [m["tool_call_id"] for m in messages[last + 1 :]]


# -- the cases ----------------------------------------------------------------------------


def test_odd_call_ids_are_stored_under_the_kits_ids_and_go_back_to_the_provider(
    worker: DevWorker, model: HostileModel, payments: PaymentsAPI
) -> None:
    reads = payments.order_reads
    answer = turn(worker, "odd-ids-1", "odd-ids")
    assert (answer["status"], answer["response"]) == ("complete", "done with odd-ids")
    assert payments.order_reads == reads + len(ODD_IDS)  # each call ran once
    stored = [c for m in history(worker, "odd-ids-1") for c in m.get("tool_calls", [])]
    assert all(CALL_ID.fullmatch(c["id"]) for c in stored)
    assert [c["provider_id"] for c in stored] == ODD_IDS
    calls, results = provider_ids_sent(sent_after_results(model, "odd-ids odd-ids-1"))
    assert calls == results == ODD_IDS
    takes_a_next_message(worker, "odd-ids-1")


def test_odd_call_ids_of_a_gated_tool_are_approved_by_the_listed_ids(
    worker: DevWorker, model: HostileModel, payments: PaymentsAPI
) -> None:
    before = len(payments.refund_requests)
    answer = turn(worker, "odd-gated-1", "odd-gated")
    assert answer["status"] == "awaiting_approval"
    status, listed = call_api(worker, "GET", "/sessions/odd-gated-1/approvals")
    assert status == 200, listed
    pending = listed["pending"]
    assert pending == answer["pending"]
    assert len(pending) == len(ODD_IDS)
    assert all(CALL_ID.fullmatch(p["tool_call_id"]) for p in pending)
    for n, waiting in enumerate(pending):
        path = f"/sessions/odd-gated-1/approvals/{waiting['tool_call_id']}"
        status, body = call_api(
            worker, "POST", path, {"approved": True, "digest": waiting["digest"]}
        )
        last = n == len(pending) - 1
        assert (status, body["status"]) == (200, "complete" if last else "awaiting_approval"), body
    assert body["response"] == "done with odd-gated"
    refunds = payments.refund_requests[before:]
    assert len(refunds) == len(ODD_IDS)  # each approved call refunded once
    assert sorted(b["order_id"] for _, b in refunds) == sorted(f"O{n}" for n in range(len(ODD_IDS)))
    assert len({h["idempotency-key"] for h, _ in refunds}) == len(ODD_IDS)
    calls, results = provider_ids_sent(sent_after_results(model, "odd-gated odd-gated-1"))
    assert calls == results == ODD_IDS
    takes_a_next_message(worker, "odd-gated-1")


def test_non_finite_numbers_in_arguments_are_invalid_arguments(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    reads, refunds = payments.order_reads, len(payments.refund_requests)
    answer = turn(worker, "nan-1", "non-finite")
    assert answer["status"] == "complete"  # the gated calls were answered, never waited
    assert payments.order_reads == reads  # no call ran
    assert len(payments.refund_requests) == refunds
    messages = history(worker, "nan-1")
    assert messages[0]["content"] == "non-finite nan-1"
    results = tool_results(messages)
    assert [r["kind"] for r in results] == ["invalid-arguments"] * 2 * len(NON_FINITE)
    assert call_api(worker, "GET", "/sessions/nan-1/approvals") == (
        200, {"session_id": answer["session_id"], "pending": []}
    )  # fmt: skip
    takes_a_next_message(worker, "nan-1")


def test_lone_surrogates_from_the_model_become_u_fffd(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    status, answer = call_api(
        worker, "POST", "/sessions/lone-1/messages", {"message": "surrogate lone-1 \ud800"}
    )
    assert (status, answer["status"]) == (200, "complete"), answer
    assert answer["response"] == "done \ufffd with surrogate"
    messages = history(worker, "lone-1")
    assert messages[0]["content"] == "surrogate lone-1 \ufffd"  # the client's lone one too
    assert messages[1]["content"] == "hi \ufffd there"
    assert [c["arguments"] for c in messages[1]["tool_calls"]] == [
        {"order_id": "A-\ufffd"}, {"order_id": "B-\ufffd"}
    ]  # fmt: skip
    # each ran with the repaired id (the payments API echoes it percent-encoded)
    assert [unquote(r["id"]) for r in tool_results(messages)] == ["A-\ufffd", "B-\ufffd"]
    takes_a_next_message(worker, "lone-1")


def test_lone_surrogates_in_a_streamed_turn_become_u_fffd(
    worker: DevWorker, model: HostileModel
) -> None:
    message = {"role": "user", "content": "surrogate-stream lone-2"}
    body = {"message": message["content"]}
    with worker.stream("POST", "/sessions/lone-2/messages", body) as stream:
        events = strict_events(stream)
    text = "".join(data["text"] for event, data in events if event == "delta")
    assert text == "hi \ufffd theredone \ufffd with surrogate-stream"  # both steps' text
    assert events[-1][0] == "done"
    assert events[-1][1]["status"] == "complete"
    assert events[-1][1]["response"] == "done \ufffd with surrogate-stream"
    asked = [r for r in model.llm_requests if message in r["messages"][1:2]]
    assert [r.get("stream") for r in asked] == [True, True]  # the model streamed both steps
    stored = [data for event, data in events if event == "message"]
    assert stored == history(worker, "lone-2")
    assert stored[1]["tool_calls"][1]["arguments"] == {"order_id": "B-\ufffd"}
    takes_a_next_message(worker, "lone-2")


def test_a_reply_too_large_to_store_is_502_and_keeps_the_users_message(
    worker: DevWorker,
) -> None:
    answer = turn(worker, "huge-1", "huge", status=502)
    assert answer["error"]["code"] == "llm-response-too-large"
    assert [(m["role"], m["content"]) for m in history(worker, "huge-1")] == [
        ("user", "huge huge-1")
    ]
    status, resumed = call_api(worker, "POST", "/sessions/huge-1/resume")
    assert (status, resumed["status"], resumed["response"]) == (200, "complete", "ok: huge")
    takes_a_next_message(worker, "huge-1")


def test_events_and_cancel_follow_a_new_sessions_first_model_call(
    worker: DevWorker, model: HostileModel
) -> None:
    model.held.clear()
    model.release.clear()
    try:
        posted = worker.start_post("/sessions/held-1/messages", {"message": "hold held-1"})
        assert model.held.wait(60), "the model call never arrived"
        with worker.stream("GET", "/sessions/held-1/events") as stream:
            model.release.set()
            events = strict_events(stream)
    finally:
        model.release.set()
    answer = posted.result(60)
    assert answer.status == 200, answer.text
    assert events[-1] == ("done", answer.body)
    assert answer.body["response"] == "released"

    model.held.clear()
    model.release.clear()
    try:
        posted = worker.start_post("/sessions/held-2/messages", {"message": "hold held-2"})
        assert model.held.wait(60), "the model call never arrived"
        status, cancelled = call_api(worker, "POST", "/sessions/held-2/cancel")
    finally:
        model.release.set()
    assert (status, cancelled["status"]) == (200, "cancelled"), cancelled
    assert posted.result(60).body["status"] == "cancelled"
    assert [m["content"] for m in history(worker, "held-2")] == ["hold held-2"]
    status, resumed = call_api(worker, "POST", "/sessions/held-2/resume")
    assert (status, resumed["status"]) == (200, "complete"), resumed
    takes_a_next_message(worker, "held-2")


def test_an_approval_after_the_session_was_deleted_is_session_not_found(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    before = len(payments.refund_requests)
    (waiting,) = turn(worker, "deleted-1", "gated")["pending"]
    assert call_api(worker, "DELETE", "/sessions/deleted-1")[0] == 200
    path = f"/sessions/deleted-1/approvals/{waiting['tool_call_id']}"
    status, body = call_api(worker, "POST", path, {"approved": True, "digest": waiting["digest"]})
    assert (status, body["error"]["code"]) == (404, "session-not-found")
    assert len(payments.refund_requests) == before


def test_a_session_token_with_a_leading_zero_in_its_expiry_is_401(worker: DevWorker) -> None:
    turn(worker, "token-1", "hello")
    status, minted = call_api(worker, "POST", "/sessions/token-1/token", {})
    assert status == 200, minted
    prefix, name, expiry, signature = minted["token"].split(".")
    assert call_api(worker, "GET", "/sessions/token-1", token=minted["token"])[0] == 200
    rewritten = f"{prefix}.{name}.0{expiry}.{signature}"
    status, body = call_api(worker, "GET", "/sessions/token-1", token=rewritten)
    assert (status, body["error"]["code"]) == (401, "unauthorized")
