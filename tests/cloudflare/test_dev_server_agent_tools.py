"""An agent calling another agent as a tool, over HTTP on `scripts/dev` (real workerd,
Pyodide, miniflare's D1, each session its own Durable Object), killed with SIGKILL.

tests/agents/delegating/: `support` calls `refunds` (`agent_tool`); the refunds agent's
`refund_order` reads the order, then POSTs the refund with the call's idempotency key to
a payments API faked on 127.0.0.1 (`PaymentsAPI`), which refunds once per key and holds
a request when asked to (so the tool is `safe_to_retry`). Three parent sessions are
brought to three points and the server is killed once, with all three in flight:

- "a": the child's write #1 has landed (its call is stored) and its handler waits on the
  order's read: the refund was never sent;
- "b": the child's refund is in flight (the API has it; the Worker has no answer);
- "c": the child's turn is over, its final reply stored, while the parent's step still
  runs its other call (a held read): the parent's result for the child is not stored.

After the restart nothing is sent to them: each turn finishes by itself (the objects'
alarms), the refunds agent's turn of each ran once (one user message, with the parent
call's idempotency key), each order was refunded once ("a" and "b": the child's call run
again after the restart; "b"'s second request carries the first one's key), and the
parent's history holds the child's answer as the call's result, not a
tool-durability-error. On the same server, a streamed parent carries the child's events,
tagged, and a reconnect mid-call replays the child's stored messages. Needs
`scripts/setup-runtime`.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PaymentsAPI, durable_object_id

from durable_agents import idempotency_key
from durable_agents.agent_tools import child_session_name
from durable_agents.messages import tool_error
from durable_agents.testing.worker import DevWorker, find_project

pytestmark = pytest.mark.slow

AGENTS = Path(__file__).parents[1] / "agents"
WATCH_S = 2  # SELF_RESUME_SECONDS: a turn left unfinished is taken up this soon
CALL = "call_refunds"  # the support agent's call of the refunds agent (its model's id)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevWorker, PaymentsAPI]]:
    with PaymentsAPI() as api:
        settings = {"PAYMENTS_API_URL": api.url, "SELF_RESUME_SECONDS": str(WATCH_S)}
        with DevWorker(
            find_project(Path(__file__).parent), tmp_path_factory.mktemp("agent-tools"),
            settings=settings, agent=AGENTS / "echo.py", agents=AGENTS / "delegating",
        ) as dev:  # fmt: skip
            yield dev, api


def parent_id(name: str) -> str:
    return durable_object_id(f"support:{name}")


def child_id(name: str) -> str:
    return durable_object_id(f"refunds:{child_session_name(parent_id(name), CALL)}")


def stored(worker: DevWorker, session_id: str) -> list[dict[str, Any]]:
    """A session's messages as D1 holds them, read from its file (not through the object)."""
    return worker.rows(
        "SELECT role, content, tool_name, tool_calls, request_key FROM agent_messages "
        f"WHERE session_id = '{session_id}' ORDER BY seq"
    )


def final(messages: list[dict[str, Any]]) -> bool:
    return bool(messages) and messages[-1]["role"] == "assistant" and not messages[-1]["tool_calls"]


def wait_for(check: Callable[[], Any], seconds: float, what: str) -> Any:
    """`check()`'s first true value; a deadline far past what a loaded machine needs."""
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.3)
    return value


def test_a_kill_at_any_point_of_the_childs_turn_runs_it_once(
    served: tuple[DevWorker, PaymentsAPI],
) -> None:
    worker, api = served
    # A whole delegation first: the child's answer is the call's result.
    done = worker.post("/agents/support/sessions/whole/messages", {"message": "refund W"})
    assert done.status == 200, done.text
    assert done.body["response"] == "support: refunds: refunded W"
    # The child's first write records the call it answers; the pages link both ways.
    whole = child_session_name(parent_id("whole"), CALL)
    (first,) = worker.rows(
        "SELECT origin, tool_call_id FROM agent_messages "
        f"WHERE session_id = '{durable_object_id('refunds:' + whole)}' AND seq = 0"
    )
    assert first == {"origin": "agent-tool", "tool_call_id": f"{parent_id('whole')}/{CALL}"}
    parent_page = worker.get("/agents/support/sessions/whole/view")
    assert f'href="/agents/refunds/sessions/{whole}/view"' in parent_page.text
    child_page = worker.get(f"/agents/refunds/sessions/{whole}/view")
    assert 'href="/agents/support/sessions/whole/view#call-call_refunds"' in child_page.text

    # "c": the child's turn ends; the parent's other call (a read of Z) is held.
    api.hold_reads = {"Z", "A"}
    turns = [worker.start_post("/agents/support/sessions/c/messages",
                               {"message": "refund C and check Z"})]  # fmt: skip
    assert api.read_received.setdefault("Z", threading.Event()).wait(90), "Z was never read"
    wait_for(lambda: final(stored(worker, child_id("c"))), 90, "the child's final reply of c")
    # "b": the child's refund reaches the API, which holds its answer.
    api.hold = True
    turns.append(worker.start_post("/agents/support/sessions/b/messages", {"message": "refund B"}))
    assert api.received.wait(90), "the refund of B never reached the API"
    # "a": the child's call is stored; its handler waits on the order's read.
    turns.append(worker.start_post("/agents/support/sessions/a/messages", {"message": "refund A"}))
    assert api.read_received.setdefault("A", threading.Event()).wait(90), "A was never read"

    before = {name: stored(worker, parent_id(name)) for name in "abc"}
    worker.kill()
    api.hold, api.hold_reads = False, set()
    api.release.set()
    for turn in turns:
        with pytest.raises((OSError, http.client.HTTPException)):
            turn.result(30)
    # At the kill: each parent's step stored its calls and no result.
    for name, messages in before.items():
        assert [m["role"] for m in messages] == ["user", "assistant"], (name, messages)
    assert [m["role"] for m in stored(worker, child_id("a"))] == ["user", "assistant"]
    assert final(stored(worker, child_id("c")))

    worker.restart()  # nothing is sent to a, b or c: their objects' alarms finish them
    answers = {name: f"support: refunds: refunded {name.upper()}" for name in "abc"}
    for name, answer in answers.items():
        messages = wait_for(
            lambda n=name: (m := stored(worker, parent_id(n))) and final(m) and m,
            120,
            f"session {name} finishing by itself",
        )
        assert messages[-1]["content"] == answer, (name, messages)
        (result,) = [m for m in messages if m["tool_name"] == "refunds"]
        assert tool_error(result["content"]) is None, result
        assert result["content"] == answer.removeprefix("support: ")
        # The child's turn ran once: one user message, keyed by the parent's call.
        child = stored(worker, child_id(name))
        keys = [m["request_key"] for m in child if m["role"] == "user"]
        assert keys == [idempotency_key(parent_id(name), CALL)], (name, child)
        assert final(child)
    # Each order refunded once: one refund per key, one key per order. "b"'s refund was
    # asked twice, with one key (in flight at the kill, then the call run again).
    refunded = sorted(r["order_id"] for r in api.refunds.values())
    assert refunded == ["A", "B", "C", "W"]
    asked = sorted(body["order_id"] for _, body in api.refund_requests)
    assert asked == ["A", "B", "B", "C", "W"]


def test_a_childs_approval_is_listed_and_decided_from_the_parents_session(
    served: tuple[DevWorker, PaymentsAPI],
) -> None:
    worker, api = served
    asked = worker.post("/agents/support/sessions/g/messages", {"message": "pay G1"})
    assert asked.status == 200, asked.text
    assert asked.body["status"] == "awaiting_approval"
    child = child_session_name(parent_id("g"), "call_payouts")
    child_id = durable_object_id(f"payouts:{child}")
    (pending,) = asked.body["pending"]
    assert (pending["tool_name"], pending["session"]) == ("payout", child_id)
    # Listed from the parent (tagged with the child's session) and from the child itself.
    assert worker.get("/agents/support/sessions/g/approvals").body["pending"] == [pending]
    (own,) = worker.get(f"/agents/payouts/sessions/{child}/approvals").body["pending"]
    assert own == {k: v for k, v in pending.items() if k != "session"}
    # A new message to the parent while the child's call waits is refused.
    refused = worker.post("/agents/support/sessions/g/messages", {"message": "refund G2"})
    assert (refused.status, refused.body["error"]["code"]) == (409, "approval-pending")
    assert not [body for _, body in api.refund_requests if body["order_id"] == "G1"]

    decision = {"approved": True, "digest": pending["digest"], "reason": "ok by test"}
    done = worker.post(f"/agents/support/sessions/g/approvals/{pending['tool_call_id']}", decision)
    assert done.status == 200, done.text
    assert (done.body["status"], done.body["response"]) == ("complete", "support: payouts: paid G1")
    assert [body["order_id"] for _, body in api.refund_requests].count("G1") == 1
    assert worker.get("/agents/support/sessions/g/approvals").body["pending"] == []


def test_the_parents_stream_carries_the_childs_events_and_a_reconnect_replays_them(
    served: tuple[DevWorker, PaymentsAPI],
) -> None:
    worker, api = served
    path = "/agents/support/sessions/{}/messages"
    with worker.stream("POST", path.format("s"), {"message": "refund S"}) as events:
        assert events.status == 200, events.json()
        seen = list(events)
    assert seen[-1].event == "done", seen
    assert seen[-1].data["response"] == "support: refunds: refunded S"
    child = child_session_name(parent_id("s"), CALL)
    tagged = [e.data for e in seen if e.event == "child"]
    assert {(d["agent"], d["session"], d["tool_call_id"]) for d in tagged} == {
        ("refunds", child, CALL)
    }
    messages = [(d["id"], d["data"]["role"]) for d in tagged if d["event"] == "message"]
    assert messages == [(0, "user"), (1, "assistant"), (2, "tool"), (3, "assistant")]
    order = [(e.event, e.id) for e in seen if e.event in ("message", "child")]
    assert order[:2] == [("message", "0"), ("message", "1")]  # the parent's call, then the child's
    assert order[-2:] == [("message", "2"), ("message", "3")]  # the call's result after them all

    # "h": the child's call is stored and its handler waits on a held read; the client
    # that started the turn is gone, and one reconnects with the parent's last position.
    api.release.clear()  # set by the test before
    api.hold_reads = {"H"}
    held = api.read_received.setdefault("H", threading.Event())
    try:
        with worker.stream("POST", path.format("h"), {"message": "refund H"}) as first:
            assert first.status == 200
            assert held.wait(90), "H was never read"
        child = child_session_name(parent_id("h"), CALL)
        events_path = "/agents/support/sessions/h/events"
        with worker.stream("GET", events_path, headers={"Last-Event-ID": "1"}) as events:
            replayed = []
            for event in events:
                replayed.append(event)
                if event.event == "child" and event.data.get("id") == 1:
                    break  # the child's stored call, replayed from its object
            api.release.set()
            live = list(events)
    finally:
        api.hold_reads = set()
        api.release.set()
    child_messages = [
        (e.data["id"], e.data["data"]["role"])
        for e in replayed + live
        if e.event == "child" and e.data["session"] == child and e.data["event"] == "message"
    ]
    assert child_messages == [(0, "user"), (1, "assistant"), (2, "tool"), (3, "assistant")]
    assert [e.event for e in replayed] == ["child", "child"]
    assert [e.id for e in live if e.event == "message"] == ["2", "3"]
    assert live[-1].event == "done"
    assert live[-1].data["response"] == "support: refunds: refunded H"
