"""Approvals over HTTP against `scripts/dev`, with the refunds example (`issue_refund`
requires approval) and a payments API on 127.0.0.1. One dev server for the module.

- `GET /sessions/{name}/approvals` lists the waiting call, with the digest anyone can
  compute from the definition in docs/approvals.md; a new message while it waits is 409
  `approval-pending`; an unknown call is 404 `approval-not-found`.
- A wrong digest is 409 `approval-digest-mismatch` and no refund reaches the payments API;
  the right one refunds exactly once (with its Idempotency-Key); a second decision is 409
  `approval-already-decided`.
- A denial: no refund, and the model saw a `tool-denied` result (the stored history).
- kill -9 between the decision and the refund's result (the payments API holds the refund
  after receiving it), restart, `/resume`: at most one refund, and a
  `tool-durability-error` for the lost result.

The offline model is the example's `make_llm` (`play_refunds`): it looks the order named
in the message up, asks to refund what is left of it (that call waits), then reports.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PaymentsAPI

from durable_agents import approval_digest
from durable_agents.testing.worker import DevWorker, find_project

pytestmark = pytest.mark.slow
REFUNDS = "examples/refunds/agent.py"


@pytest.fixture(scope="module")
def worker(payments: PaymentsAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    state = tmp_path_factory.mktemp("approvals-dev-worker")
    with DevWorker(
        find_project(Path(__file__).parent),
        state,
        settings={"PAYMENTS_API_URL": payments.url},
        agent=REFUNDS,
    ) as dev:
        yield dev


def _waiting(worker: DevWorker, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A new turn on session `name`: it answers awaiting_approval with one waiting refund."""
    reply = worker.post(f"/sessions/{name}/messages", {"message": f"refund order {name}"})
    assert (reply.status, reply.body["status"]) == (200, "awaiting_approval"), reply.text
    (pending,) = reply.body["pending"]
    assert pending["tool_name"] == "issue_refund"
    return reply.body, pending


def _decide(worker: DevWorker, name: str, call_id: str, **decision: Any) -> Any:
    return worker.post(f"/sessions/{name}/approvals/{call_id}", decision)


def _results(worker: DevWorker, name: str, tool_name: str) -> list[dict[str, Any]]:
    history = worker.get(f"/sessions/{name}").body["messages"]
    return [json.loads(m["content"]) for m in history
            if m["role"] == "tool" and m.get("tool_name") == tool_name]  # fmt: skip


def test_waiting_calls_are_listed_and_block_a_new_message(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    before = len(payments.refund_requests)
    body, pending = _waiting(worker, "listed")
    # The digest is docs/approvals.md's: sha256 of [session_id, tool_call_id, tool_name, arguments].
    assert pending["digest"] == approval_digest(
        body["session_id"], pending["tool_call_id"], "issue_refund", pending["arguments"]
    )
    listed = worker.get("/sessions/listed/approvals")
    assert listed.status == 200, listed.text
    assert listed.body["pending"] == [pending]

    blocked = worker.post("/sessions/listed/messages", {"message": "something else"})
    assert (blocked.status, blocked.body["error"]["code"]) == (409, "approval-pending")
    unknown = _decide(worker, "listed", "call_nope", approved=True, digest=pending["digest"])
    assert (unknown.status, unknown.body["error"]["code"]) == (404, "approval-not-found")
    resumed = worker.post("/sessions/listed/resume")  # waits still: the same answer
    assert (resumed.status, resumed.body["status"]) == (200, "awaiting_approval")
    assert resumed.body["pending"] == [pending]
    assert len(payments.refund_requests) == before  # nothing refunded


def test_a_wrong_digest_is_refused_and_the_right_one_refunds_once(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    before = len(payments.refund_requests)
    _, pending = _waiting(worker, "approved")
    call_id = pending["tool_call_id"]

    other = dict(pending["arguments"], amount_cents=pending["arguments"]["amount_cents"] + 1)
    for digest in ("0" * 64, approval_digest("x", call_id, "issue_refund", other)):
        wrong = _decide(worker, "approved", call_id, approved=True, digest=digest)
        assert (wrong.status, wrong.body["error"]["code"]) == (409, "approval-digest-mismatch")
    assert len(payments.refund_requests) == before  # no refund reached the payments API
    assert worker.get("/sessions/approved/approvals").body["pending"] == [pending]

    done = _decide(worker, "approved", call_id, approved=True, digest=pending["digest"],
                   reason="ann: ok")  # fmt: skip
    assert (done.status, done.body["status"]) == (200, "complete"), done.text
    assert done.body["response"].startswith("Refunded 49.99 on order approved")
    assert len(payments.refund_requests) == before + 1  # exactly one refund...
    headers, body = payments.refund_requests[-1]
    assert headers["idempotency-key"].startswith("da-")  # ...with its key
    assert body == pending["arguments"]  # the approved arguments, exactly
    (result,) = _results(worker, "approved", "issue_refund")
    assert result["status"] == "succeeded"

    again = _decide(worker, "approved", call_id, approved=False, digest=pending["digest"])
    assert (again.status, again.body["error"]["code"]) == (409, "approval-already-decided")
    assert worker.get("/sessions/approved/approvals").body["pending"] == []
    assert len(payments.refund_requests) == before + 1


def test_a_denied_refund_never_runs_and_the_model_sees_tool_denied(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    before = len(payments.refund_requests)
    _, pending = _waiting(worker, "denied")
    done = _decide(worker, "denied", pending["tool_call_id"], approved=False,
                   digest=pending["digest"], reason="bob: outside the refund window")  # fmt: skip
    assert (done.status, done.body["status"]) == (200, "complete"), done.text
    assert "denied (bob: outside the refund window)" in done.body["response"]
    assert len(payments.refund_requests) == before
    (denied,) = _results(worker, "denied", "issue_refund")
    assert denied["kind"] == "tool-denied"
    assert (denied["toolName"], denied["toolCallId"]) == ("issue_refund", pending["tool_call_id"])
    assert denied["reason"] == "bob: outside the refund window"
    # The model's next call saw it: the final reply comes after the tool-denied result.
    history = worker.get("/sessions/denied").body["messages"]
    assert history[-1]["role"] == "assistant"
    assert history[-2]["role"] == "tool"
    assert history[-2]["tool_name"] == "issue_refund"


def test_kill_9_between_the_decision_and_the_refunds_result_then_resume(
    worker: DevWorker, payments: PaymentsAPI
) -> None:
    body, pending = _waiting(worker, "killed")
    payments.hold = True
    payments.received.clear()
    payments.release.clear()
    try:
        turn = worker.start_post(
            f"/sessions/killed/approvals/{pending['tool_call_id']}",
            {"approved": True, "digest": pending["digest"], "reason": "ann: ok"},
        )
        assert payments.received.wait(90), "the refund never reached the payments API"
        worker.kill()  # the payments API refunded; the Worker dies before the answer
    finally:
        payments.hold = False
        payments.release.set()
    with pytest.raises((OSError, http.client.HTTPException)):
        turn.result(30)
    key = payments.refund_requests[-1][0]["idempotency-key"]
    assert payments.refunds_keyed(key) == 1

    worker.restart()
    resumed = worker.post("/sessions/killed/resume")
    assert (resumed.status, resumed.body["status"]) == (200, "complete"), resumed.text
    assert payments.refunds_keyed(key) == 1  # at most one refund: the claimed call never reran
    assert "may have gone through" in resumed.body["response"]
    (lost,) = _results(worker, "killed", "issue_refund")
    assert lost["kind"] == "tool-durability-error"
    assert lost["toolName"] == "issue_refund"
    assert worker.get("/sessions/killed/approvals").body["pending"] == []
    events = worker.rows(
        f"SELECT event FROM agent_approvals WHERE session_id = '{body['session_id']}' "
        f"AND tool_call_id = '{pending['tool_call_id']}' ORDER BY rowid"
    )
    assert [e["event"] for e in events] == ["requested", "approved", "claimed"]
