"""`scripts/dev --agent FILE`: the dev server serves any agent module, and knows none.

- With `PAYMENTS_API_URL` empty, the refund example's own dev stub answers (the
  example's offline `make_llm` as the model): a refund approved over HTTP lands
  once, keyed; only the served agent's settings are printed, and never a value
  from .dev.vars. Its SIGKILL-while-the-refund-is-held story, with the URL from
  the environment, is test_worker_harness.py's.
- An agent module that breaks the protocol does not stop the server: it says why once,
  and the Worker answers every request with that reason (500, `agent-not-loaded`).
- An agent module outside the project, its settings from .dev.vars and the
  environment (never printed), and reloading it: test_dev_server_settings.py.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.worker_fakes import REFUNDS_AGENT, DevServer

pytestmark = pytest.mark.slow


def message(text: str) -> bytes:
    return json.dumps({"message": text}).encode()


def test_the_refund_examples_dev_stub_answers_while_its_setting_is_empty(
    tmp_path: Path,
) -> None:
    stubbed = DevServer(tmp_path / "refunds", {}, "SOME_SECRET=hunter2-value\n",
                        agent=REFUNDS_AGENT)  # fmt: skip
    try:
        stubbed.start()
        out = "\n".join(stubbed.lines)
        url = f"{stubbed.url}/__dev/PAYMENTS_API_URL"
        assert f"PAYMENTS_API_URL is not set: using the agent's dev stub {url}" in out
        assert "hunter2" not in out
        assert "SOME_SECRET" not in out  # not the agent's: not printed
        status, _, reply = stubbed.request(
            "POST", "/sessions/stubbed/messages", message("refund order 7"), token="dev-token"
        )
        assert status == 200, reply
        assert reply["status"] == "awaiting_approval"
        (pending,) = reply["pending"]
        decision = json.dumps({"approved": True, "digest": pending["digest"]}).encode()
        status, _, reply = stubbed.request(
            "POST", f"/sessions/stubbed/approvals/{pending['tool_call_id']}", decision,
            token="dev-token",
        )  # fmt: skip
        assert (status, reply["status"]) == (200, "complete"), reply
        assert reply["response"].startswith("Refunded 49.99 on order 7")
        stubbed.wait_for_line(
            r"payments stub refunded 4999 cents of order 7: .+ \(Idempotency-Key da"
        )
        status, _, order = stubbed.request("GET", "/__dev/PAYMENTS_API_URL/orders/7", token=None)
        assert (status, order["refunded_cents"]) == (200, 4999)
        # The stub gets the query string with its path (and this one ignores it).
        status, _, order = stubbed.request(
            "GET", "/__dev/PAYMENTS_API_URL/orders/7?expand=refunds", token=None
        )
        assert (status, order["id"], order["refunded_cents"]) == (200, "7", 4999)

    finally:
        stubbed.kill_all()


def test_an_agent_module_that_breaks_the_protocol_is_named_and_the_server_stays_up(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken_agent.py"
    broken.write_text("from durable_agents import Agent\nAGENT = Agent('broken')\n")
    server = DevServer(tmp_path / "state", {"API_TOKEN": "test-token"}, agent=broken)
    why = f"{broken} must define make_deps(env, http)"
    try:
        server.start()
        for path in ("/sessions/s/messages", "/sessions/s"):
            status, _, body = server.request("POST" if "messages" in path else "GET", path,
                                             message("hi"))  # fmt: skip
            assert (status, body["error"]["code"]) == (500, "agent-not-loaded"), body
            assert body["error"]["message"].startswith(why)
        assert server.process is not None
        assert server.process.poll() is None
        out = "\n".join(server.lines)
        assert f"dev: the agent module does not load on CPython: {why}" in out
        # Said by the server (CPython) and the Worker (at its import): not per request.
        assert out.count(f"{why}: what the tools get as ctx.deps") == 2, out
    finally:
        server.kill_all()
