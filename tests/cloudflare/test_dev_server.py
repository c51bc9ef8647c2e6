"""The Worker end to end over HTTP: `scripts/dev` (`wrangler dev` on real workerd, D1 and
the Durable Objects persisted where wrangler keeps them) serving the triage example
(`--agent examples/triage/agent.py`) with a fake LLM, issue tracker and webhook.

The crash test SIGKILLs the dev server's process group (wrangler and its workerd
processes: the Worker dies mid-turn) while the webhook holds the answer to a post it
has received (the side effect happened, its result was never stored), restarts it on
the same state and resumes: exactly one post, a `tool-durability-error` in the
history, seen by the LLM, and wrangler itself counts the session's rows in the same
D1 files.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import (
    DURABILITY_REPLY,
    DevServer,
    FakeServices,
    d1_query,
    durable_object_id,
    wrangler,
)

pytestmark = pytest.mark.slow

TOKEN = "test-token"
HEX_ID = re.compile(r"[0-9a-f]{64}")


def message(text: str) -> bytes:
    return json.dumps({"message": text}).encode()


def alive(pid: int) -> bool:
    """Running (a zombie left for init to reap counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as fakes:
        yield fakes


def test_crash_after_the_post_then_resume_posts_once(
    services: FakeServices, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    # Settings: wrangler.toml [vars] (demo), then .dev.vars, then the environment.
    dev_vars = f'# test settings\nAPI_TOKEN="{TOKEN}"\nexport LLM_PROVIDER=anthropic\n'
    # The resume here is the client's: no self-resume (the object's alarm, 30 s after the
    # turn began) during a restart slowed by a loaded machine (test_dev_server_alarms.py's).
    env = {**services.worker_env(), "SELF_RESUME_SECONDS": "3600"}
    first = DevServer(state, env, dev_vars).start()
    second = DevServer(state, first.env, dev_vars)
    try:
        # 1. A whole turn: get_issue, then post_slack, then the reply.
        status, _, reply = first.request("POST", "/sessions/first/messages", message("issue 7"))
        assert status == 200, reply
        assert reply["status"] == "complete"
        assert reply["response"] == "Triaged issue 7 and posted to #triage."
        assert reply["session_id"] == durable_object_id("first")
        assert len(services.posts) == 1
        _, history = first.request("GET", "/sessions/first")[::2]
        called = [c["name"] for m in history["messages"] for c in m.get("tool_calls", [])]
        assert called == ["get_issue", "post_slack"]

        # 2. The webhook receives the post and holds its answer; the server dies.
        services.hold_posts = True
        outcome: list[Any] = []

        def send() -> None:
            try:
                outcome.append(first.request("POST", "/sessions/second/messages",
                                             message("triage issue 42")))  # fmt: skip
            except Exception as exc:  # the connection dies with the server
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        assert services.post_received.wait(60), "the webhook never got the post"
        assert first.process is not None
        workerd = _workerd_processes(first.process.pid)
        assert workerd, "no workerd runs in the dev server's process group"
        first.crash()
        assert not any(alive(pid) for pid in workerd), "the killed server's workerd still runs"
        services.hold_posts = False
        services.release_posts.set()
        sender.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], Exception), outcome
        assert len(services.posts) == 2

        # 3. Restart on the same state: the post's call is stored, its result is not.
        second.start()
        status, _, before = second.request("GET", "/sessions/second")
        assert status == 200
        last = before["messages"][-1]
        assert last["role"] == "assistant"
        assert [c["name"] for c in last["tool_calls"]] == ["post_slack"]
        llm_calls_before = len(services.llm_requests)

        status, _, resumed = second.request("POST", "/sessions/second/resume")
        assert status == 200, resumed
        assert resumed["status"] == "complete"
        assert resumed["response"] == DURABILITY_REPLY
        session_id = resumed["session_id"]
        assert HEX_ID.fullmatch(session_id)
        assert session_id == durable_object_id("second") != durable_object_id("first")

        # Exactly one post for the session, with its idempotency key.
        assert len(services.posts) == 2
        key = services.posts[1][0].get("idempotency-key", "")
        assert key.startswith("da-")
        assert key != services.posts[0][0].get("idempotency-key")

        # The history holds the durability error, and the LLM was shown it.
        _, _, after = second.request("GET", "/sessions/second")
        results = [m for m in after["messages"] if m["role"] == "tool"]
        assert json.loads(results[-1]["content"])["kind"] == "tool-durability-error"
        assert results[-1]["tool_name"] == "post_slack"
        assert len(services.llm_requests) == llm_calls_before + 1
        shown = services.llm_requests[-1]["messages"]
        assert any(m["role"] == "tool" and "tool-durability-error" in m["content"] for m in shown)
        resumed_again = second.request("POST", "/sessions/second/resume")[2]
        assert resumed_again["response"] == DURABILITY_REPLY
        assert resumed_again["steps"] == 0
    finally:
        second.kill_all()
        first.kill_all()

    # 4. wrangler reads the same D1 files: it counts the session's rows.
    rows = d1_query(
        f"SELECT COUNT(*) AS n FROM agent_messages WHERE session_id = '{session_id}'", state
    )
    assert rows == [{"n": len(after["messages"])}]
    sql = f"SELECT message_count FROM agent_sessions WHERE id = '{session_id}'"
    sessions = d1_query(sql, state)
    assert sessions == [{"message_count": len(after["messages"])}]
    print(f"dev server start: {first.start_s:.1f} s, restart: {second.start_s:.1f} s")


def _workerd_processes(group: int) -> list[int]:
    """The workerd processes of the process group `group` (the dev server's: wrangler
    runs workerd twice, its proxy and the Worker)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
            if int(fields[2]) == group and b"workerd" in cmdline and fields[0] != "Z":
                found.append(int(entry))
    return found


# --- the offline quickstart, and requests that must be refused -------------------


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """The dev server as a fresh checkout runs it (the template is the triage example):
    no settings at all."""
    server = DevServer(tmp_path_factory.mktemp("quickstart"), {}).start()
    try:
        yield server
    finally:
        server.kill_all()


def test_quickstart_runs_offline_with_the_demo_model_and_stubs(quickstart: DevServer) -> None:
    out = "\n".join(quickstart.lines)
    assert (
        "dev: agent triage; model: demo (the agent's make_llm decides); session store: d1 "
        "(SESSION_STORE from [vars])"
    ) in out
    assert 'dev: API_TOKEN is not set: using "dev-token" (set it in .dev.vars)' in out
    # Each setting with its source; values only where they are not secret.
    assert "dev: LLM_PROVIDER=demo ([vars])" in out
    assert "dev: CHAT_PAGE=on (the default)" in out
    for name in ("ISSUES_API_URL", "SLACK_WEBHOOK_URL"):
        stub = f"{name} is not set: using the agent's dev stub {quickstart.url}/__dev/{name}"
        assert stub in out
    assert "PAYMENTS_API_URL" not in out, "only the served agent's settings are printed"
    # CHAT_PAGE is on by default here: the banner's last line says where the page is.
    ready = quickstart.lines.index(f"dev: ready on {quickstart.url}")
    quickstart.wait_for_line(r"^dev: chat page: ")
    assert quickstart.lines[ready + 1] == f"dev: chat page: {quickstart.url}/"
    page = quickstart.worker.request("GET", "/", token="")
    assert page.status == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    status, _, reply = quickstart.request(
        "POST", "/sessions/demo/messages", message("triage issue 42"), token="dev-token"
    )
    assert status == 200, reply
    assert reply["response"] == "Triaged issue 42 and posted a summary to #triage."
    quickstart.wait_for_line(r"slack stub received a post to #triage: .+ \(Idempotency-Key da-")
    logged = quickstart.wait_for_line(r"^POST /sessions/demo/messages ")
    assert re.fullmatch(r"POST /sessions/demo/messages 200 OK \(\d+ms\)", logged)


def test_a_retry_with_its_idempotency_key_runs_no_second_turn(quickstart: DevServer) -> None:
    key = {"idempotency-key": "retry-test-1"}
    replies = [
        quickstart.request(
            "POST",
            "/sessions/retried/messages",
            message("triage issue 7"),
            token="dev-token",
            headers=key,
        )
        for _ in range(2)
    ]
    assert [status for status, _, _ in replies] == [200, 200]
    (_, _, first), (_, _, second) = replies
    assert second["response"] == first["response"]
    assert (first["steps"], second["steps"]) == (3, 0)
    _, _, history = quickstart.request("GET", "/sessions/retried", token="dev-token")
    users = [m for m in history["messages"] if m["role"] == "user"]
    assert users == [
        {"position": 0, "role": "user", "content": "triage issue 7", "request_key": "retry-test-1"}
    ]
    status, _, reused = quickstart.request(
        "POST", "/sessions/retried/messages", message("triage issue 8"), token="dev-token",
        headers=key,
    )  # fmt: skip
    assert (status, reused["error"]["code"]) == (422, "request-key-reused")


BAD_REQUESTS: list[tuple[str, str, bytes | None, dict[str, str], int]] = [
    # method, path, body, extra headers, expected status
    ("POST", "/sessions/bad-1/messages", b"{nope", {}, 400),
    ("POST", "/sessions/bad-2/messages", b"", {}, 400),
    ("POST", "/sessions/bad-3/messages", b'{"message": 42}', {}, 422),
    ("POST", "/sessions/bad-4/messages", b'{"text": "hi"}', {}, 422),
    ("POST", "/sessions/bad-5/messages", b'{"message": "hi", "x": 1}', {}, 422),
    ("POST", "/sessions/bad-6/messages", b'{"message": "  "}', {}, 422),
    ("POST", "/sessions/bad-7/messages", b'["triage issue 1"]', {}, 422),
    ("POST", "/sessions/bad-8/messages", message("x" * 70_000), {}, 413),
    ("POST", "/sessions/bad-9/resume", b'{"message": "hi"}', {}, 422),
    ("POST", "/sessions/bad.name/messages", message("triage issue 1"), {}, 400),
    ("POST", "/sessions/" + "n" * 65 + "/messages", message("triage issue 1"), {}, 400),
    ("GET", "/sessions/bad-10/messages", None, {}, 405),
    ("DELETE", "/sessions/bad-11/resume", None, {}, 405),
    ("PUT", "/sessions/bad-12/messages", message("triage issue 1"), {}, 405),
    ("POST", "/sessions/bad-13/other", message("triage issue 1"), {}, 404),
    ("GET", "/no-such-route", None, {}, 404),
    ("POST", "/sessions/bad-14/resume", None, {}, 404),  # nothing to resume
]


def test_malformed_requests_are_refused_and_write_nothing(quickstart: DevServer) -> None:
    for method, path, body, headers, expected in BAD_REQUESTS:
        status, reply_headers, reply = quickstart.request(
            method, path, body, token="dev-token", headers=headers
        )
        assert status == expected, (method, path, reply)
        assert set(reply) == {"error"}, reply
        assert set(reply["error"]) == {"code", "message"}
        if status == 405:
            assert reply_headers.get("allow") in ("GET", "POST")
    for name in ("bad-1", "bad-3", "bad-8", "bad-9", "bad-14"):
        assert quickstart.request("GET", f"/sessions/{name}", token="dev-token")[0] == 404
    _assert_only_session(quickstart, "demo")


@pytest.mark.parametrize("token", [None, "", "wrong", "dev-token-but-longer"])
def test_requests_without_the_token_are_401_and_write_nothing(
    quickstart: DevServer, token: str | None
) -> None:
    for method, path, body in (
        ("POST", "/sessions/unauth/messages", message("triage issue 1")),
        ("POST", "/sessions/demo/resume", None),
        ("GET", "/sessions/demo", None),
    ):
        status, headers, reply = quickstart.request(method, path, body, token=token)
        assert status == 401, reply
        assert reply["error"]["code"] == "unauthorized"
        assert headers.get("www-authenticate", "").startswith("Bearer")
    assert quickstart.request("GET", "/sessions/unauth", token="dev-token")[0] == 404


def _assert_only_session(server: DevServer, name: str) -> None:
    """D1 (read by wrangler) holds rows of session `name` and of no session other than
    those the module's passing tests write. Run while the server is up: wrangler opens
    the same SQLite files beside the server's workerd."""
    session_id = durable_object_id(name)
    allowed = {session_id, durable_object_id("retried")}
    rows = d1_query(
        "SELECT session_id, COUNT(*) AS n FROM agent_messages GROUP BY session_id",
        server.state_dir,
    )
    stored = {row["session_id"] for row in rows}
    assert session_id in stored
    assert stored <= allowed, stored - allowed
    sessions = {row["id"] for row in d1_query("SELECT id FROM agent_sessions", server.state_dir)}
    assert sessions == stored


# --- deploy tooling, offline -----------------------------------------------------


def test_wrangler_deploy_dry_run_accepts_the_worker(tmp_path: Path) -> None:
    out = wrangler("deploy", "--dry-run", "--outdir", str(tmp_path / "dist"))
    assert "--dry-run: exiting now." in out
    for binding in ("env.SESSIONS (AgentSession)", "env.DB (durable-agents)"):
        assert binding in out
    assert (tmp_path / "dist" / "entry.py").is_file()
    assert (tmp_path / "dist" / "durable_agents" / "cloudflare" / "app.py").is_file()


def test_wrangler_applies_the_migrations_to_a_fresh_local_database(tmp_path: Path) -> None:
    out = wrangler("d1", "migrations", "apply", "durable-agents", "--local", persist_to=tmp_path)
    assert "0001_init.sql" in out
    again = wrangler("d1", "migrations", "apply", "durable-agents", "--local", persist_to=tmp_path)
    assert "No migrations to apply" in again


def test_after_the_dev_server_wrangler_has_nothing_to_apply(quickstart: DevServer) -> None:
    out = wrangler(
        "d1", "migrations", "apply", "durable-agents", "--local", persist_to=quickstart.state_dir
    )
    assert "No migrations to apply" in out
