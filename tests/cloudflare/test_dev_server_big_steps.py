"""Steps of 1,000 tool calls, over HTTP against `scripts/dev` (real workerd), on both stores.

Issue 19, item 5: a model asking for 1,000 tool calls in one step, twice in a
session. The step's results are one append; written as one INSERT per row it
was a D1 batch of 1,002 statements, which D1 refuses (each statement of a batch
is a query of the invocation: 50 on Workers Free, 1,000 on Paid) and
miniflare's D1 runs. Now such an append is a few packed statements
(`_appends.append_statements`) on D1 and in a Durable Object's SQLite alike.

Per store (`SESSION_STORE` d1, then durable-object; one dev server each): a
1,000-call turn, a second one streamed (`Accept: text/event-stream`), every
call with exactly its one result stored (texts with what JSON escapes, NUL
and U+0001 too), the history read back by a strict JSON parser, and a next
message taken.

The agent is written by the fixture: the triage example's two tools (a safe
read `get_issue`, a side effect `post_slack`) kept inside the Worker, so a turn
is the store's work and the model's, not 1,000 fetches: the tools' own
requests and time-outs are not what this file is about.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.worker_fakes import DevServer, FakeServices, read_history

pytestmark = pytest.mark.slow
CALLS = 1000
# What a result carries: what JSON must escape, and NUL and U+0001 (what a packed
# text spells differently), in a str stored as it is.
TEXT = 'q"b\\s\n\t \u2028 \x00\x01\x01\x00 é😀'
AGENT = f'''"""The triage example's tools without their HTTP: answers made in the Worker."""

from pydantic import BaseModel

from durable_agents import Agent, tool

TEXT = {TEXT!r}


class IssueRef(BaseModel):
    id: str


class SlackPost(BaseModel):
    channel: str
    text: str


@tool(safe_to_retry=True)
async def get_issue(args: IssueRef) -> str:
    """Fetch an issue by id."""
    return f"issue {{args.id}}: {{TEXT}}"


@tool
async def post_slack(args: SlackPost) -> str:
    """Post a message to a Slack channel."""
    return f"posted to {{args.channel}}: {{args.text}}"


AGENT = Agent(
    "big-steps", "Use the tools as asked.", [get_issue, post_slack], max_steps=4,
    max_tool_calls_per_step=1000,
)  # fmt: skip


def make_deps(env, http):
    return None
'''


def expected_result(name: str, arguments: dict[str, str]) -> str:
    if name == "get_issue":
        return f"issue {arguments['id']}: {TEXT}"
    return f"posted to {arguments['channel']}: {arguments['text']}"


class ThousandCalls(FakeServices):
    """A model that answers a turn's user message "calls N" with N tool calls in one
    step (get_issue and post_slack in turn), then says how many results it got; any
    other message, a plain answer."""

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.llm_requests.append(body)
        messages = body["messages"]
        start = max(i for i, m in enumerate(messages) if m["role"] == "user")
        ask, turn = messages[start]["content"], messages[start:]
        results = [m for m in turn if m["role"] == "tool"]
        message: dict[str, Any] = {"role": "assistant", "content": f"Done: {len(results)}."}
        if not body.get("tools"):  # the kit folding older turns into a summary
            message["content"] = "Earlier turns asked for their calls and got them."
        elif not results and ask.startswith("calls "):
            count, label = int(ask.split()[1]), ask.split()[2]
            message = {"role": "assistant", "content": "On it.", "tool_calls": [
                {"id": f"{label}_{n}", "type": "function", "function": _call(label, n)}
                for n in range(count)
            ]}  # fmt: skip
        elif not results:
            message["content"] = "You are welcome."
        finish = "tool_calls" if "tool_calls" in message else "stop"
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return {"id": "chatcmpl-big", "object": "chat.completion", "model": "fake",
                "choices": [choice], "usage": usage}  # fmt: skip


def _call(label: str, n: int) -> dict[str, str]:
    if n % 2:
        arguments = {"channel": "#triage", "text": f"{label} post {n} \x01"}
        return {"name": "post_slack", "arguments": json.dumps(arguments)}
    return {"name": "get_issue", "arguments": json.dumps({"id": f"{label}-{n}"})}


@pytest.fixture(scope="module", params=["d1", "durable-object"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevServer]:
    folder = tmp_path_factory.mktemp(f"big-steps-{request.param}")
    agent = folder / "big_steps_agent.py"
    agent.write_text(AGENT, encoding="utf-8")
    with ThousandCalls() as model:
        env = {**model.worker_env(), "API_TOKEN": "test-token", "SESSION_STORE": request.param}
        dev = DevServer(folder / "state", env, agent=agent)
        dev.start()
        try:
            yield dev
        finally:
            dev.kill_all()


def strict_json(raw: bytes) -> Any:
    """`raw` as a strict parser reads it: UTF-8 strictly, no NaN or infinity."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in an answer")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


def history(dev: DevServer, name: str) -> list[dict[str, Any]]:
    def get(path: str) -> Any:
        request = urllib.request.Request(
            f"{dev.url}{path}", headers={"authorization": "Bearer test-token"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return strict_json(response.read())

    return read_history(get, name, limit=1000)


def check_turn(messages: list[dict[str, Any]], ask: str) -> None:
    """One turn of CALLS calls as stored: the user message, the step, one result per call
    in call order, the final answer."""
    user, step, *results, final = messages
    assert (user["role"], user["content"]) == ("user", ask)
    calls = step["tool_calls"]
    assert step["role"] == "assistant"
    assert len(calls) == CALLS
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    for call, result in zip(calls, results, strict=True):
        assert (result["role"], result["tool_name"]) == ("tool", call["name"])
        assert result["content"] == expected_result(call["name"], call["arguments"])
    assert (final["role"], final["content"]) == ("assistant", f"Done: {CALLS}.")


def test_two_thousand_call_turns_are_stored_whole_and_the_session_goes_on(
    server: DevServer,
) -> None:
    worker = server.worker
    started = time.monotonic()
    first = worker.post("/sessions/big/messages", {"message": "calls 1000 one"}, timeout=180)
    assert first.status == 200, (first.status, first.text[:2000], server.lines[-30:])
    assert (first.body["status"], first.body["response"]) == ("complete", f"Done: {CALLS}.")

    with worker.stream(
        "POST", "/sessions/big/messages", {"message": "calls 1000 two"}, timeout=180
    ) as events:
        assert events.status == 200
        streamed = list(events)
    # Near the default max_context_tokens: the first turn may be folded into a summary
    # (a system message) before the second's answer is asked for; never the second turn.
    stored = [e.data for e in streamed if e.event == "message" and "summary_of" not in e.data]
    summaries = [e.data for e in streamed if e.event == "message" and "summary_of" in e.data]
    assert len(stored) == CALLS + 3  # the user message, the step, the results, the answer
    assert [s["summary_of"] for s in summaries] in ([], [[0, CALLS + 3]])
    done = streamed[-1]
    assert done.event == "done", streamed[-3:]
    assert (done.data["status"], done.data["response"]) == ("complete", f"Done: {CALLS}.")

    messages = [m for m in history(server, "big") if "summary_of" not in m]
    assert len(messages) == 2 * (CALLS + 3)
    check_turn(messages[: CALLS + 3], "calls 1000 one")
    check_turn(messages[CALLS + 3 :], "calls 1000 two")

    after = worker.post("/sessions/big/messages", {"message": "thanks"}, timeout=60)
    assert after.status == 200, after.text[:2000]
    assert after.body["response"] == "You are welcome."
    assert len(history(server, "big")) == 2 * (CALLS + 3) + len(summaries) + 2
    print(f"two {CALLS}-call turns and a next message: {time.monotonic() - started:.1f} s")
