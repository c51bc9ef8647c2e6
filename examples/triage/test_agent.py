"""The triage example on CPython: a whole turn over HTTP (httpx.MockTransport), a
crash right after the Slack post then a resume (one post, a durability error),
its settings, its offline model, its dev stubs, and the module served through
the Worker's API (`serve_session`) on the fake D1 binding.

Over HTTP in the local runtime: tests/cloudflare/test_dev_server*.py serve this
module with `scripts/dev --agent examples/triage/agent.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from durable_agents import ConfigurationError, ToolDurabilityError, run
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.cloudflare.app import Command, LiveSession, serve_session
from durable_agents.llm import FunctionLLM, OpenAILLM
from durable_agents.stores import sqlite_store
from durable_agents.testing import SimulatedCrash, crash_on_write
from durable_agents.testing.fake_d1 import FakeD1Database
from examples.triage import agent as triage

ENV = {"ISSUES_API_URL": "http://issues.test/api", "SLACK_WEBHOOK_URL": "http://slack.test/hook"}


class Upstreams:
    """The issue tracker and the webhook, on an httpx.MockTransport: posts are recorded."""

    def __init__(self) -> None:
        self.posts: list[httpx.Request] = []
        self.fetches = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.startswith("/api/issues/"):
            self.fetches += 1
            issue = request.url.path.rsplit("/", 1)[1]
            return httpx.Response(200, json={"id": issue, "title": "Login fails", "status": "open"})
        if request.method == "POST" and str(request.url) == ENV["SLACK_WEBHOOK_URL"]:
            self.posts.append(request)
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(404)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))


async def test_a_turn_fetches_the_issue_posts_once_and_reports(tmp_path: Any) -> None:
    upstreams = Upstreams()
    async with upstreams.client() as http:
        result = await run(
            triage.AGENT,
            llm=triage.make_llm({}),
            message="triage issue 42",
            deps=triage.make_deps(ENV, http),
        )
    assert result.status == "complete", result.error
    assert result.response == "Triaged issue 42 and posted a summary to #triage."
    (post,) = upstreams.posts
    assert json.loads(post.content) == {
        "channel": "#triage",
        "text": "Issue 42: Login fails (open)",
    }
    assert post.headers["idempotency-key"].startswith("da-")


async def test_a_crash_after_the_post_then_resume_posts_once_and_says_so(tmp_path: Any) -> None:
    upstreams = Upstreams()
    store = sqlite_store(tmp_path / "triage.db")
    llm = FunctionLLM(triage.play_triage)
    try:
        async with upstreams.client() as http:
            deps = triage.make_deps(ENV, http)
            # Write #4 stores post_slack's result: the process dies before it.
            with pytest.raises(SimulatedCrash):
                await run(triage.AGENT, llm=llm, message="triage issue 7", session_id="s",
                          store=crash_on_write(store, 4), deps=deps)  # fmt: skip
            assert len(upstreams.posts) == 1
            resumed = await run(triage.AGENT, llm=llm, session_id="s", store=store, deps=deps)
        history = await store.load_messages("s")
    finally:
        await store.close()
    assert len(upstreams.posts) == 1
    assert resumed.status == "complete"
    assert "I will not post again" in resumed.response
    errors = [e for m in history if (e := ToolDurabilityError.from_message(m))]
    assert [e.tool_name for e in errors] == ["post_slack"]


def test_make_deps_names_every_missing_setting_and_reads_a_worker_env() -> None:
    with pytest.raises(ConfigurationError, match="ISSUES_API_URL and SLACK_WEBHOOK_URL not set"):
        triage.make_deps({}, httpx.AsyncClient())
    with pytest.raises(ConfigurationError, match=r"^SLACK_WEBHOOK_URL not set"):
        triage.make_deps({**ENV, "SLACK_WEBHOOK_URL": "  "}, httpx.AsyncClient())

    class WorkerEnv:  # attribute access, as a Worker's env
        ISSUES_API_URL = ENV["ISSUES_API_URL"]
        SLACK_WEBHOOK_URL = ENV["SLACK_WEBHOOK_URL"]

    deps = triage.make_deps(WorkerEnv(), httpx.AsyncClient())
    assert (deps.issues_api_url, deps.slack_webhook_url) == tuple(ENV.values())


def test_make_llm_plays_triage_offline_and_defers_to_the_settings_otherwise() -> None:
    for env in ({}, {"LLM_PROVIDER": "demo"}, {"LLM_PROVIDER": " Demo ", "LLM_API_KEY": "k"}):
        assert isinstance(triage.make_llm(env), FunctionLLM)
    real = triage.make_llm({"LLM_PROVIDER": "openai", "LLM_BASE_URL": "http://llm.test/v1"})
    assert isinstance(real, OpenAILLM)
    with pytest.raises(ConfigurationError, match="LLM_PROVIDER"):
        triage.make_llm({"LLM_API_KEY": "sk-something"})


def test_the_offline_model_reads_deep_results_as_text() -> None:
    deep = '{"error": ' + "[" * 20_000 + "]" * 20_000 + "}"
    assert triage._parse(deep) == {"text": deep}


def test_the_dev_stubs_know_every_issue_and_log_each_post_once() -> None:
    issues, slack = triage.DEV_STUBS["ISSUES_API_URL"], triage.DEV_STUBS["SLACK_WEBHOOK_URL"]
    assert issues("GET", "/issues/ABC%2D1", b"", {}) == (
        200, {"id": "ABC-1", "title": "Example issue ABC-1 (dev stub)", "status": "open"},
    )  # fmt: skip
    assert issues("POST", "/issues/1", b"", {})[0] == 404
    body = json.dumps({"channel": "#t", "text": "hi"}).encode()
    key = {"idempotency-key": "stub-test-key"}
    assert slack("POST", "/", body, key) == (200, {"ok": True, "duplicate": False})
    assert slack("POST", "/", body, key) == (200, {"ok": True, "duplicate": True})
    assert slack("POST", "/", b"{nope", {})[0] == 400
    assert slack("GET", "/", b"", {})[0] == 404


def stub_client(stubs: Mapping[str, Any]) -> httpx.AsyncClient:
    """An http client whose requests to http://dev.test/__dev/<NAME>/... reach the stubs,
    as the dev server wires them."""

    def handle(request: httpx.Request) -> httpx.Response:
        name, _, rest = request.url.path.removeprefix("/__dev/").partition("/")
        status, body = stubs[name](request.method, "/" + rest, request.content, request.headers)
        return httpx.Response(status, json=body)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


async def test_the_module_served_by_the_worker_api_with_its_dev_stubs() -> None:
    served = AgentModule.load(triage)
    env = {name: f"http://dev.test/__dev/{name}" for name in served.dev_stubs}
    store = d1_store(FakeD1Database())
    await store.create_tables()
    async with stub_client(served.dev_stubs) as http:
        reply = await serve_session(
            Command("message", "triage issue 42"), session_id="ab" * 32, store=store, env=env,
            live=LiveSession(), agent=served.agent, make_deps=served.make_deps,
            make_llm=served.make_llm, http_client=http,
        )  # fmt: skip
    assert reply.status == 200, reply.body
    assert reply.body["response"] == "Triaged issue 42 and posted a summary to #triage."
