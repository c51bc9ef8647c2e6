"""The Worker harness (`dev_worker`, `DevWorker`) end to end, and the issue's acceptance on it:
the refunds example's turn waits for approval, the refund is approved with its digest, the
Worker is killed with SIGKILL while the payments API holds the refund, restarted, `/resume`d:
exactly one refund, with an Idempotency-Key, and a tool-durability-error stored.

Real processes: `scripts/dev` (`wrangler dev` on real workerd: Pyodide, D1, the session's
Durable Object) and a payments API on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PaymentsAPI

from durable_agents.testing.worker import DevWorker, running_in_group

pytestmark = pytest.mark.slow
REFUNDS = "examples/refunds/agent.py"


def _tool_results(messages: list[dict[str, Any]], tool_name: str) -> list[dict[str, Any]]:
    return [
        json.loads(m["content"]) if m["content"].startswith("{") else {"result": m["content"]}
        for m in messages
        if m["role"] == "tool" and m.get("tool_name") == tool_name
    ]


def test_kill_9_while_the_payments_api_holds_the_refund_then_resume_refunds_once(
    dev_worker: Callable[..., DevWorker], payments: PaymentsAPI
) -> None:
    worker = dev_worker(settings={"PAYMENTS_API_URL": payments.url}, agent=REFUNDS)
    waiting = worker.post("/sessions/refund-7/messages", {"message": "Refund order 7"})
    assert (waiting.status, waiting.body["status"]) == (200, "awaiting_approval"), waiting.text
    (pending,) = waiting.body["pending"]
    assert pending["tool_name"] == "issue_refund"
    assert payments.refund_requests == []  # nothing refunded before a person says yes

    payments.hold = True
    decision = {"approved": True, "digest": pending["digest"], "reason": "ann: ok"}
    turn = worker.start_post(f"/sessions/refund-7/approvals/{pending['tool_call_id']}", decision)
    assert payments.received.wait(90), "the refund never reached the payments API"
    worker.kill()  # the payments API has the refund; the Worker dies before its answer
    payments.release.set()
    with pytest.raises((OSError, http.client.HTTPException)):
        turn.result(30)  # the client never got an answer

    worker.restart()
    resumed = worker.post("/sessions/refund-7/resume")
    assert resumed.status == 200, resumed.text
    assert resumed.body["status"] == "complete"

    assert len(payments.refund_requests) == 1  # exactly one refund...
    headers, _ = payments.refund_requests[0]
    assert re.fullmatch(r"da-[0-9a-f]{40}", headers["idempotency-key"])  # ...with its key
    history = worker.get("/sessions/refund-7").body["messages"]
    refund_results = _tool_results(history, "issue_refund")
    assert [r.get("kind") for r in refund_results] == ["tool-durability-error"]
    assert refund_results[0]["toolName"] == "issue_refund"
    # lookup_order ran before the approval and its result was stored: it is not run again.
    assert payments.order_reads == 1
    assert [r.get("kind") for r in _tool_results(history, "lookup_order")] == [None]
    # The decision and the claim, read by wrangler from D1's event log.
    events = worker.rows("SELECT event, reason FROM agent_approvals ORDER BY rowid")
    assert [e["event"] for e in events] == ["requested", "approved", "claimed"]
    assert events[1]["reason"] == "ann: ok"

    # What D1 holds, read by wrangler: the turn's message once, one durability error.
    assert worker.count("SELECT * FROM agent_messages WHERE role = 'user'") == 1
    durability = (
        "SELECT * FROM agent_messages WHERE role = 'tool' AND tool_name = 'issue_refund' "
        "AND json_extract(content, '$.kind') = 'tool-durability-error'"
    )
    assert worker.count(durability) == 1

    again = worker.post("/sessions/refund-7/resume")  # a finished turn: its reply, no new call
    assert (again.status, again.body["response"]) == (200, resumed.body["response"])
    assert len(payments.refund_requests) == 1


def test_the_harness_isolates_settings_keeps_state_and_leaves_no_process(
    dev_worker: Callable[..., DevWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A setting exported in the developer's shell never reaches the server.
    monkeypatch.setenv("PAYMENTS_API_URL", "http://127.0.0.1:9/from-the-shell")
    worker = dev_worker(agent=REFUNDS, token="s3cret")
    worker.wait_for_line(r"PAYMENTS_API_URL.*dev stub")
    assert worker.get("/sessions/x", token="wrong").status == 401
    first = worker.post("/sessions/iso/messages", {"message": "refund order 1"})
    assert (first.status, first.body["status"]) == (200, "awaiting_approval"), first.text
    assert worker.rows("SELECT role FROM agent_messages ORDER BY seq")[0] == {"role": "user"}

    groups = [os.getpgid(worker.process.pid) if worker.process else None]
    worker.kill()  # the state survives a SIGKILL
    worker.restart()
    assert worker.get("/sessions/iso").body["messages"][0]["content"] == "refund order 1"
    groups.append(os.getpgid(worker.process.pid) if worker.process else None)
    assert groups[-1] is not None
    alive = running_in_group(groups[-1])
    names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in alive]
    assert "workerd" in names, names  # workerd is in the group

    worker.close()
    assert not worker.running
    assert len(set(groups)) == 2  # each start its own group: scripts/dev, wrangler, workerd
    for group in groups:
        assert group is not None
        assert running_in_group(group) == []  # no process of any start runs
