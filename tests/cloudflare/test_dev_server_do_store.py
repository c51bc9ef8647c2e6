"""`SESSION_STORE = "durable-object"` over HTTP against `scripts/dev`: the history lives in the
session's Durable Object's own SQLite (none of it in D1), the listing still finds the session
through its D1 index row, delete removes both, and the kill -9 end-to-end test of D1 holds:
the post held by the webhook, SIGKILL, restart, /resume: one post, a durability error stored.

One dev server for the module (each test its own sessions), with the union of the settings
the tests need: `RETENTION_DAYS` only matters when the cron fires, which one test does. The
kill -9 test kills it and starts it again on the same state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.worker_fakes import DURABILITY_REPLY, DevServer, FakeServices

from durable_agents.testing.worker import DevWorker

RETENTION_DAYS = 0.00003  # 2.6 s: sessions idle longer go when the cron fires
SETTINGS = {
    "API_TOKEN": "test-token",
    "SESSION_STORE": "durable-object",
    "RETENTION_DAYS": str(RETENTION_DAYS),
}


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def dev(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = DevServer(tmp_path_factory.mktemp("do-store"), {**services.worker_env(), **SETTINGS})
    server.start()
    try:
        yield server
    finally:
        services.release_posts.set()
        server.kill_all()


@pytest.fixture
def worker(dev: DevServer, services: FakeServices) -> DevWorker:
    """The module's server, running (a test before may have failed while it was down),
    and the fakes as new: no post recorded, none held."""
    services.reset()
    if not dev.worker.running:
        dev.worker.restart()
    return dev.worker


def _listed(worker: DevWorker) -> dict[str, int]:
    """Session name -> message count, for every session the listing shows (one page)."""
    page = worker.get("/sessions?limit=100").body
    assert page["next_cursor"] is None, page  # the module's sessions fit in one page
    return {s["name"]: s["message_count"] for s in page["sessions"]}


def test_sessions_live_in_the_object_and_are_listed_through_the_d1_index(
    worker: DevWorker,
) -> None:
    answer = worker.post("/sessions/local-1/messages", {"message": "triage issue 5"})
    assert answer.status == 200, answer.body
    assert answer.body["status"] == "complete"
    session_id = answer.body["session_id"]
    history = worker.get("/sessions/local-1").body["messages"]
    assert [m["role"] for m in history] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert worker.count("SELECT 1 FROM agent_messages") == 0  # nothing of any session in D1
    index = worker.rows(f"SELECT name, message_count FROM agent_sessions WHERE id = '{session_id}'")
    assert index == [{"name": "local-1", "message_count": 6}]
    assert _listed(worker).get("local-1") == 6
    assert worker.get("/sessions/local-1/view").status == 200

    assert worker.request("DELETE", "/sessions/local-1").status == 200
    assert worker.get("/sessions/local-1").status == 404
    assert "local-1" not in _listed(worker)
    assert worker.count(f"SELECT 1 FROM agent_sessions WHERE id = '{session_id}'") == 0


def test_kill_9_mid_post_then_resume_posts_once_with_the_durable_object_store(
    dev: DevServer, worker: DevWorker, services: FakeServices
) -> None:
    services.hold_posts = True
    pending = worker.start_post("/sessions/crash-do/messages", {"message": "triage issue 8"})
    assert services.post_received.wait(60), "the post never arrived"
    dev.crash()  # SIGKILL between the post and its stored result
    assert pending.exception(30) is not None
    services.hold_posts = False
    services.release_posts.set()

    worker.restart()
    resumed = worker.post("/sessions/crash-do/resume")
    assert resumed.status == 200, resumed.body
    assert resumed.body["response"] == DURABILITY_REPLY
    assert len(services.posts) == 1  # never posted twice
    tools = [m for m in worker.get("/sessions/crash-do").body["messages"] if m["role"] == "tool"]
    assert '"kind": "tool-durability-error"' in tools[-1]["content"]
    assert worker.count("SELECT 1 FROM agent_messages") == 0


def test_retention_deletes_idle_sessions_in_their_objects(worker: DevWorker) -> None:
    idle = worker.post("/sessions/idle-do/messages", {"message": "triage issue 1"})
    time.sleep(RETENTION_DAYS * 86400 + 0.5)
    worker.post("/sessions/fresh-do/messages", {"message": "triage issue 2"})
    fired = worker.request("GET", "/cdn-cgi/handler/scheduled?cron=17+*+*+*+*", token="")
    assert (fired.status, fired.text) == (200, "ok")
    assert worker.get("/sessions/idle-do").status == 404  # gone from its object
    assert worker.get("/sessions/fresh-do").status == 200
    # Every session of the tests before is idle too: the listing keeps only the fresh one.
    assert list(_listed(worker)) == ["fresh-do"]
    session_id = idle.body["session_id"]
    assert worker.count(f"SELECT 1 FROM agent_sessions WHERE id = '{session_id}'") == 0


def test_a_session_deleted_under_a_running_turn_ends_it_with_a_conflict(
    worker: DevWorker, services: FakeServices
) -> None:
    services.hold_posts = True
    pending = worker.start_post("/sessions/doomed/messages", {"message": "triage issue 4"})
    assert services.post_received.wait(60), "the post never arrived"
    assert worker.request("DELETE", "/sessions/doomed").status == 200
    services.hold_posts = False
    services.release_posts.set()  # write #2 of the post step now conflicts
    answer = pending.result(60)
    assert answer.status == 409, answer.body
    assert answer.body["error"]["code"] == "session-conflict"
    assert worker.get("/sessions/doomed").status == 404  # nothing written back
    assert worker.post("/sessions/after/messages", {"message": "hello"}).status == 200
