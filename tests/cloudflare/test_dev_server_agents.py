"""`scripts/dev --agent FILE`: the dev server serves any agent module, and knows none.

- The refund example against a fake payments API whose URL comes only from
  .dev.vars (`PAYMENTS_API_URL` is in no `[vars]`): the banner says it is set,
  never its value, and the turn reaches the API and waits for approval
  (`issue_refund` requires it). Its SIGKILL-while-the-refund-is-held story is
  test_worker_harness.py's. The model is the example's offline `make_llm`.
- With `PAYMENTS_API_URL` empty, the example's own dev stub answers; only the
  served agent's settings are printed, and never a value from .dev.vars or
  the environment.
- An agent module outside the project, and one that breaks the protocol.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_fakes import REFUNDS_AGENT, DevServer, PaymentsAPI

pytestmark = pytest.mark.slow

TOKEN = "test-token"


def message(text: str) -> bytes:
    return json.dumps({"message": text}).encode()


def test_the_refunds_agent_takes_its_setting_from_dev_vars_and_never_prints_it(
    payments: PaymentsAPI, tmp_path: Path
) -> None:
    # (Its kill -9 while the refund is held, from the environment's setting, is
    # test_worker_harness.py's: the same server path, started once there.)
    server = DevServer(tmp_path / "state", {"API_TOKEN": TOKEN},
                       f"PAYMENTS_API_URL={payments.url}\n", agent=REFUNDS_AGENT)  # fmt: skip
    try:
        server.start()
        out = "\n".join(server.lines)
        assert "dev: agent refunds; model: demo (the agent's make_llm decides)" in out
        assert "dev: PAYMENTS_API_URL is set" in out
        assert payments.url not in out  # a setting's value is never printed
        assert "ISSUES_API_URL" not in out
        status, _, waiting = server.request("POST", "/sessions/refund-1/messages",
                                            message("refund order 1001"))  # fmt: skip
        assert (status, waiting["status"]) == (200, "awaiting_approval"), waiting
        assert payments.order_reads == 1  # the URL from .dev.vars reached the tool
        assert payments.refund_requests == []
    finally:
        server.kill_all()


ECHO_AGENT = """
from durable_agents import Agent, LLMResponse
from durable_agents.llm.offline import FunctionLLM
from durable_agents.llm.settings import setting

AGENT = Agent("echo", "Say the greeting.")
SETTINGS = ("ECHO_GREETING",)


def make_deps(env, http):
    return None


def make_llm(env):
    return FunctionLLM(lambda messages, tools: LLMResponse(str(setting(env, "ECHO_GREETING"))))
"""


def test_the_refund_examples_dev_stub_and_an_agent_outside_the_project(
    tmp_path: Path,
) -> None:
    stubbed = DevServer(tmp_path / "refunds", {}, "SOME_SECRET=hunter2-value\n",
                        agent=REFUNDS_AGENT)  # fmt: skip
    outside = tmp_path / "elsewhere" / "echo_agent.py"
    outside.parent.mkdir()
    outside.write_text(ECHO_AGENT)
    echo = DevServer(tmp_path / "echo", {"API_TOKEN": TOKEN, "ECHO_GREETING": "hello from env"},
                     agent=outside)  # fmt: skip
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

        echo.start()
        out = "\n".join(echo.lines)
        assert "dev: agent echo; model: demo (the agent's make_llm decides)" in out
        assert "dev: ECHO_GREETING is set" in out
        assert "hello from env" not in out
        status, _, reply = echo.request("POST", "/sessions/e/messages", message("hi"))
        assert (status, reply["response"]) == (200, "hello from env")
        # No dev stubs in this agent: /__dev/ is an ordinary unknown path.
        assert echo.request("GET", "/__dev/ECHO_GREETING/x")[0] == 404
    finally:
        stubbed.kill_all()
        echo.kill_all()


def test_an_agent_module_that_breaks_the_protocol_stops_the_start_with_its_reason(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken_agent.py"
    broken.write_text("from durable_agents import Agent\nAGENT = Agent('broken')\n")
    server = DevServer(tmp_path / "state", {}, agent=broken)
    with pytest.raises(RuntimeError, match=r"exited \(1\) before it was ready") as raised:
        server.start()
    assert "must define make_deps(env, http)" in str(raised.value)
    assert server.process is not None
    assert server.process.wait(10) == 1
