"""Failure paths end to end, over HTTP against `scripts/dev` (issue 8, items 2 and 3).

- The first LLM call of a turn fails for good: 502, the user message is kept,
  and `POST /resume` finishes that turn with that message (on a new session
  and on one with an earlier turn).
- The Slack webhook drops the connection after it received the post: the
  model is told the effect is of unknown outcome (`tool-durability-error`),
  not a plain failure, and the post is not repeated.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.worker_fakes import DevServer, FakeServices, d1_query, read_history, serving

pytestmark = pytest.mark.slow


class Services(FakeServices):
    """The fakes, with an LLM that can be made to fail and a webhook that can hang up."""

    def __init__(self) -> None:
        super().__init__()
        self.llm_down = False
        self.hang_up_after_post = False

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.llm_down:
            self.llm_requests.append(body)
            # A 200 that carries an error: not worth retrying, so it fails at once.
            return {"error": {"message": "model is gone", "type": "invalid_request_error"}}
        return super().chat(body)

    def post(self, headers: dict[str, str], body: dict[str, Any]) -> None:
        super().post(headers, body)
        if self.hang_up_after_post:
            raise ConnectionAbortedError("the webhook hangs up after acting")


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    with Services() as fakes:
        yield fakes


@pytest.fixture(scope="module")
def server(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    with serving(services, tmp_path_factory.mktemp("failures") / "state") as dev:
        yield dev


def send(server: DevServer, name: str, text: str) -> tuple[int, dict[str, Any]]:
    status, _, body = server.request(
        "POST", f"/sessions/{name}/messages", json.dumps({"message": text}).encode()
    )
    return status, body


def history(server: DevServer, name: str) -> list[dict[str, Any]]:
    def get(path: str) -> Any:
        status, _, body = server.request("GET", path)
        assert status == 200, body
        return body

    return read_history(get, name)


@pytest.mark.parametrize("earlier_turn", [False, True], ids=["new-session", "second-turn"])
def test_a_turn_whose_llm_fails_keeps_its_message_and_resume_finishes_it(
    server: DevServer, services: Services, earlier_turn: bool
) -> None:
    name = f"llm-down-{earlier_turn}"
    if earlier_turn:
        assert send(server, name, "triage issue 1")[0] == 200
    services.llm_down = True
    try:
        status, body = send(server, name, "triage issue 77")
    finally:
        services.llm_down = False
    assert status == 502, body
    assert body["error"]["code"] == "llm-error"
    assert history(server, name)[-1] == {"role": "user", "content": "triage issue 77"}

    status, _, resumed = server.request("POST", f"/sessions/{name}/resume")
    assert status == 200, resumed
    assert resumed["status"] == "complete"
    assert "issue 77" in resumed["response"]
    users = [m["content"] for m in history(server, name) if m["role"] == "user"]
    assert users == (["triage issue 1"] if earlier_turn else []) + ["triage issue 77"]
    # The model saw the kept message once, as the turn's message.
    last_request = services.llm_requests[-1]["messages"]
    assert [m["content"] for m in last_request if m["role"] == "user"][-1] == "triage issue 77"


def test_a_post_whose_connection_drops_is_an_unknown_outcome_not_a_failure(
    server: DevServer, services: Services
) -> None:
    posts_before = len(services.posts)
    services.hang_up_after_post = True
    try:
        status, body = send(server, "hangup", "triage issue 5")
    finally:
        services.hang_up_after_post = False
    assert status == 200, body
    assert len(services.posts) == posts_before + 1, "posted once, never again"
    results = [json.loads(m["content"]) for m in history(server, "hangup") if m["role"] == "tool"]
    post_result = results[-1]
    assert post_result["kind"] == "tool-durability-error", post_result
    assert post_result["toolName"] == "post_slack"
    assert "Do not repeat it blindly" in post_result["error"]
    rows = d1_query(
        "SELECT COUNT(*) AS n FROM agent_messages WHERE role = 'tool' "
        "AND content LIKE '%tool-durability-error%'",
        server.state_dir,
    )
    assert rows[0]["n"] >= 1
