"""Turns that finish by themselves, and scheduled turns, on `scripts/dev` (issue 21).

Real processes: `scripts/dev` (wrangler dev on real workerd: Pyodide, D1, the
session's Durable Object and its alarm) serving the template's triage agent, and
its model, issue tracker and Slack webhook faked over HTTP on 127.0.0.1
(`FakeServices`). The server is killed with SIGKILL and started again on the same
state. While a turn must finish by itself nothing is sent to its session: the
history is read from D1 by wrangler.
"""

from __future__ import annotations

import datetime
import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from tests.support.worker_fakes import (
    DURABILITY_REPLY,
    TRIAGE_AGENT,
    FakeServices,
    durable_object_id,
)

from durable_agents.testing.pytest_plugin import find_project
from durable_agents.testing.worker import DevWorker

pytestmark = pytest.mark.slow
WATCH_S = 3  # SELF_RESUME_SECONDS: how long a turn may go unfinished before its alarm checks
SECRET = "s" * 40  # SESSION_TOKEN_SECRET: at least 32 bytes


class ManyPosts(FakeServices):
    """The fakes, with a model that answers "post N" with N post_slack calls in one step
    (each a real fetch to the fake webhook), then says how many results it got; every
    other turn it plays as FakeServices does (the triage bot)."""

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        start = max(i for i, m in enumerate(messages) if m["role"] == "user")
        ask, turn = messages[start]["content"], messages[start:]
        if not ask.startswith("post "):
            return super().chat(body)
        with self._lock:
            self.llm_requests.append(body)
        results = [m for m in turn if m["role"] == "tool"]
        message: dict[str, Any] = {"role": "assistant", "content": f"Posted: {len(results)}."}
        if not results and ask.startswith("post "):
            message = {"role": "assistant", "content": "Posting.", "tool_calls": [
                {"id": f"p_{n}", "type": "function", "function": {
                    "name": "post_slack",
                    "arguments": json.dumps({"channel": "#many", "text": f"post {n}"}),
                }}
                for n in range(int(ask.split()[1]))
            ]}  # fmt: skip
        finish = "tool_calls" if "tool_calls" in message else "stop"
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        return {"id": "chatcmpl-many", "object": "chat.completion", "model": "fake",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage}  # fmt: skip


@pytest.fixture(scope="module")
def module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DevWorker, ManyPosts]]:
    """One dev server for the module (the free plan: the template's), serving the triage
    example (src/agent.py is the user's); each test its own sessions. The kill -9 test
    kills it and starts it again on its state."""
    project = find_project(Path(str(request.config.rootpath)))
    with ManyPosts() as fake:
        settings = {**fake.worker_env(), "SELF_RESUME_SECONDS": str(WATCH_S),
                    "SESSION_TOKEN_SECRET": SECRET}  # fmt: skip
        worker = DevWorker(project, tmp_path_factory.mktemp("alarms"), settings, agent=TRIAGE_AGENT)
        try:
            yield worker.start(), fake
        finally:
            fake.release_posts.set()
            worker.close()


@pytest.fixture
def shared(module_server: tuple[DevWorker, ManyPosts]) -> tuple[DevWorker, ManyPosts]:
    """The module's server, running (a test that failed while it was down left it down),
    and its fakes with nothing recorded and no post held."""
    worker, services = module_server
    services.reset()
    services.llm_requests.clear()
    if not worker.running:
        worker.restart()
    return worker, services


def _stored(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    """The session's messages as D1 holds them, read by wrangler (not through the object)."""
    return worker.rows(
        "SELECT role, content, tool_name, request_key, origin FROM agent_messages "
        f"WHERE session_id = '{durable_object_id(name)}' ORDER BY seq"
    )


def _wait_for(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.5)


def _final(messages: list[dict[str, Any]]) -> bool:
    return (
        bool(messages)
        and messages[-1]["role"] == "assistant"
        and ("tool_calls" not in messages[-1] or not messages[-1].get("tool_calls"))
        and messages[-1]["content"] not in ("Looking it up.", "Posting.")
    )


def test_a_turn_killed_while_slack_holds_its_post_finishes_by_itself_after_a_restart(
    shared: tuple[DevWorker, ManyPosts],
) -> None:
    """Two sessions killed mid-post: nothing is sent to "heal" (its alarm finishes it);
    a client reconnects to the /events of "watched" (its object resumes the turn first,
    and the client follows it to its end). And a schedule of a third session falls due
    while the server is down: it runs once after the restart."""
    worker, services = shared
    assert worker.post("/sessions/later/messages", {"message": "Triage issue 2"}).status == 200
    services.hold_posts = True
    turns = []
    for name in ("heal", "watched"):
        services.post_received.clear()
        turns.append(worker.start_post(f"/sessions/{name}/messages", {"message": "Triage issue 7"}))
        assert services.post_received.wait(90), "the post never reached the webhook"
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    made = _schedule(worker, "later", at=at.isoformat())
    worker.kill()  # Slack has the posts; the Worker dies before its answers
    services.hold_posts = False
    services.release_posts.set()
    for turn in turns:
        with pytest.raises((OSError, http.client.HTTPException)):
            turn.result(30)
    time.sleep(max(0.0, (at - datetime.datetime.now(datetime.UTC)).total_seconds() + 1))
    worker.restart()  # the schedule fell due while nothing ran

    # A client following "watched" reconnects to its /events (as EventSource does) until
    # the turn it follows has ended: its first request wakes the object, whose alarm
    # resumes the turn at once.
    seen: list[Any] = []
    for _ in range(20):
        with worker.stream("GET", f"/sessions/watched/events?after={3 + len(seen)}") as events:
            got = list(events)
        seen += [e for e in got if e.event == "message"]
        if got and got[-1].event == "done" and got[-1].data["status"] != "interrupted":
            seen.append(got[-1])
            break
        time.sleep(0.5)
    assert seen[-1].event == "done", seen
    assert seen[-1].data["status"] == "complete"
    assert seen[-1].data["response"] == DURABILITY_REPLY
    stored = [e.data for e in seen if e.event == "message"]
    assert [m["role"] for m in stored] == ["tool", "assistant"], stored
    assert all(m.get("origin") == "self-resumed" for m in stored), stored

    started = time.monotonic()
    try:
        messages = _wait_for(
            lambda: (m := _stored(worker, "heal")) and _final(m) and m,
            90,
            "the turn finishing by itself",
        )
    except AssertionError:
        print("\n".join(worker.lines[-80:]), _stored(worker, "heal"))
        raise
    print(f"finished by itself {time.monotonic() - started:.1f} s after the restart")
    _wait_for(lambda: _final(_stored(worker, "later")) and _scheduled_turns(worker, "later"),
              60, "the overdue schedule")  # fmt: skip
    turns_later = _scheduled_turns(worker, "later")
    assert [t["request_key"] for t in turns_later] == [f"schedule:{made['schedule_id']}"]
    assert _llm_saw(services, "Triage issue 42") == 1
    # Exactly one side effect per turn: heal's, watched's, later's first and its schedule's.
    assert len(services.posts) == 4
    results = [m for m in messages if m["role"] == "tool" and m["tool_name"] == "post_slack"]
    assert [json.loads(r["content"])["kind"] for r in results] == ["tool-durability-error"]
    assert results[0]["origin"] == "self-resumed"
    assert messages[-1]["content"] == DURABILITY_REPLY
    assert messages[-1]["origin"] == "self-resumed"
    assert [m["origin"] for m in messages[:3]] == [None, None, None]  # the client's turn

    # /resume now: the turn is finished, so it answers its reply and runs nothing.
    again = worker.post("/sessions/heal/resume")
    assert (again.status, again.body["response"]) == (200, DURABILITY_REPLY), again.text
    assert len(services.posts) == 4


def _schedule(worker: DevWorker, name: str, **when: Any) -> dict[str, Any]:
    made = worker.post(f"/sessions/{name}/schedules", {"message": "Triage issue 42", **when})
    assert made.status == 201, made.text
    return dict(made.body)


def _scheduled_turns(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    return [m for m in _stored(worker, name) if m["role"] == "user" and m["origin"]]


def _llm_saw(services: FakeServices, text: str) -> int:
    """How many model requests ended with the user message `text` (its turn's first call)."""
    return sum(1 for body in services.llm_requests if body["messages"][-1].get("content") == text)


def test_a_schedule_runs_once_and_a_deleted_one_never(
    shared: tuple[DevWorker, ManyPosts],
) -> None:
    worker, services = shared
    for name in ("soon", "never"):
        first = worker.post(f"/sessions/{name}/messages", {"message": "Triage issue 1"})
        assert first.status == 200, first.text
    posts_before = len(services.posts)

    made = _schedule(worker, "soon", delay_seconds=3)
    assert made["schedule_id"].startswith("sch_")
    due = datetime.datetime.fromisoformat(made["at"].replace("Z", "+00:00"))
    assert 2 <= (due - datetime.datetime.now(datetime.UTC)).total_seconds() <= 4
    listed = worker.get("/sessions/soon/schedules")
    assert [s["schedule_id"] for s in listed.body["schedules"]] == [made["schedule_id"]]
    cancelled = _schedule(worker, "never", delay_seconds=3)
    gone = worker.request("DELETE", f"/sessions/never/schedules/{cancelled['schedule_id']}")
    assert (gone.status, gone.body) == (
        200,
        {"schedule_id": cancelled["schedule_id"], "deleted": True},
    )
    again = worker.request("DELETE", f"/sessions/never/schedules/{cancelled['schedule_id']}")
    assert (again.status, again.body["error"]["code"]) == (404, "schedule-not-found")
    _refusals_over_http(worker)

    turns = _wait_for(lambda: _scheduled_turns(worker, "soon"), 30, "the scheduled turn")
    _wait_for(lambda: _final(_stored(worker, "soon")), 30, "its reply")
    time.sleep(4)  # time enough for a second firing, if there were one
    turns = _scheduled_turns(worker, "soon")
    assert [(t["content"], t["origin"]) for t in turns] == [("Triage issue 42", "scheduled")]
    assert turns[0]["request_key"] == f"schedule:{made['schedule_id']}"
    assert _llm_saw(services, "Triage issue 42") == 1  # the model saw it once
    assert len(services.posts) == posts_before + 1
    assert worker.get("/sessions/soon/schedules").body["schedules"] == []
    assert _scheduled_turns(worker, "never") == []


def test_a_recurring_schedule_runs_an_occurrence_once_and_keeps_the_next(
    shared: tuple[DevWorker, ManyPosts],
) -> None:
    """An interval (the shortest, 60 s) whose first occurrence is 2 s away (`at`): the
    object's alarm runs it once, and the same write moved the rule to its next occurrence,
    60 s after the first (from the rule, not from when the turn ended). Deleting the rule
    stops it. Bounded by outcomes: the second occurrence is not waited for."""
    worker, services = shared
    assert worker.post("/sessions/rhythm/messages", {"message": "Triage issue 1"}).status == 200
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    made = _schedule(worker, "rhythm", every_seconds=60, at=at.isoformat())
    assert (made["every_seconds"], made["next_at"]) == (60, made["at"])
    first = _ms(made["at"])
    for bad, words in (({"every_seconds": 59}, "every_seconds must be 60"),
                       ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
                       ({"cron": "61 * * * *"}, "cron")):  # fmt: skip
        refused = worker.post("/sessions/rhythm/schedules", {"message": "x", **bad})
        assert (refused.status, refused.body["error"]["code"]) == (422, "invalid-schedule")
        assert words in refused.body["error"]["message"]

    _wait_for(lambda: _scheduled_turns(worker, "rhythm"), 30, "the occurrence's turn")
    _wait_for(lambda: _final(_stored(worker, "rhythm")), 30, "its reply")
    time.sleep(3)  # time enough for a second firing of it, if there were one
    turns = _scheduled_turns(worker, "rhythm")
    assert [t["request_key"] for t in turns] == [f"schedule:{made['schedule_id']}@{first}"]
    assert _llm_saw(services, "Triage issue 42") >= 1
    (waiting,) = worker.get("/sessions/rhythm/schedules").body["schedules"]
    assert (waiting["schedule_id"], _ms(waiting["next_at"])) == (
        made["schedule_id"],
        first + 60_000,
    )
    gone = worker.request("DELETE", f"/sessions/rhythm/schedules/{made['schedule_id']}")
    assert gone.status == 200, gone.text
    assert worker.get("/sessions/rhythm/schedules").body["schedules"] == []


def test_an_occurrence_killed_mid_post_runs_once_and_the_next_stays_on_time(
    shared: tuple[DevWorker, ManyPosts],
) -> None:
    """kill -9 during an occurrence: its turn (its alarm's) is killed while Slack holds its
    post; after the restart the object's alarm finishes it by itself, without posting
    again, and the rule still waits for its next occurrence, 60 s after this one's due
    time (the rule's, not the restart's). The next occurrence is not waited for."""
    worker, services = shared
    assert worker.post("/sessions/beat/messages", {"message": "Triage issue 1"}).status == 200
    posts_before = len(services.posts)
    services.hold_posts = True
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    made = _schedule(worker, "beat", every_seconds=60, at=at.isoformat())
    first = _ms(made["at"])
    assert services.post_received.wait(90), "the occurrence's post never reached the webhook"
    worker.kill()  # Slack has the post; the Worker dies before its answer
    services.hold_posts = False
    services.release_posts.set()
    started = time.monotonic()
    worker.restart()  # nothing is sent to "beat": its alarm finishes the turn
    try:
        messages = _wait_for(
            lambda: (m := _stored(worker, "beat")) and _final(m) and m,
            90,
            "the occurrence's turn finishing by itself",
        )
    except AssertionError:
        print("\n".join(worker.lines[-80:]), _stored(worker, "beat"))
        raise
    print(f"the occurrence finished {time.monotonic() - started:.1f} s after the restart")

    turns = _scheduled_turns(worker, "beat")
    assert [(t["request_key"], t["origin"]) for t in turns] == [
        (f"schedule:{made['schedule_id']}@{first}", "scheduled")
    ]
    assert _llm_saw(services, "Triage issue 42") == 1  # no second occurrence ran
    assert len(services.posts) == posts_before + 1  # posted once: the resume did not post
    assert messages[-1]["content"] == DURABILITY_REPLY
    assert messages[-1]["origin"] == "self-resumed"
    (waiting,) = worker.get("/sessions/beat/schedules").body["schedules"]
    assert (waiting["schedule_id"], _ms(waiting["next_at"])) == (
        made["schedule_id"],
        first + 60_000,  # from the rule: a next occurrence counted from now would drift
    )
    gone = worker.request("DELETE", f"/sessions/beat/schedules/{made['schedule_id']}")
    assert gone.status == 200, gone.text


def test_a_day_of_missed_occurrences_is_one_catch_up_turn(
    shared: tuple[DevWorker, ManyPosts],
) -> None:
    """A rule every 15 minutes whose occurrences were due for a day while nothing ran: the
    stored rule's due time is a day past, as a Worker not invoked for a day leaves it
    (its first occurrence, `at`, a day ago). The object's alarm runs ONE turn, not 96,
    and the rule's next occurrence is the first on its grid after now."""
    worker, services = shared
    assert worker.post("/sessions/away/messages", {"message": "Triage issue 1"}).status == 200
    seen_before = _llm_saw(services, "Triage issue 42")
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    made = _schedule(worker, "away", every_seconds=900, at=at.isoformat())
    first = _ms(made["at"])
    _wait_for(lambda: _scheduled_turns(worker, "away"), 30, "the catch-up turn")
    _wait_for(lambda: _final(_stored(worker, "away")), 30, "its reply")
    time.sleep(3)  # time enough for a second firing, if the missed ones piled up
    turns = _scheduled_turns(worker, "away")
    assert [t["request_key"] for t in turns] == [f"schedule:{made['schedule_id']}@{first}"]
    assert _llm_saw(services, "Triage issue 42") == seen_before + 1
    (waiting,) = worker.get("/sessions/away/schedules").body["schedules"]
    following = _ms(waiting["next_at"])
    now = datetime.datetime.now(datetime.UTC).timestamp() * 1000
    assert (following - first) % 900_000 == 0  # on the rule's grid
    assert following - 900_000 <= now < following + 60_000  # the first after the catch-up
    gone = worker.request("DELETE", f"/sessions/away/schedules/{made['schedule_id']}")
    assert gone.status == 200, gone.text


def test_a_cron_rule_in_a_zone_runs_on_workerd(shared: tuple[DevWorker, ManyPosts]) -> None:
    """A cron rule with a zone is made on real workerd: cronsim and the tzdata package are
    in the Worker's bundle (Pyodide has no zone database of its own)."""
    worker, _ = shared
    assert worker.post("/sessions/zoned/messages", {"message": "Triage issue 1"}).status == 200
    made = _schedule(worker, "zoned", cron="0 9 * * *", timezone="Europe/Berlin")
    due = datetime.datetime.fromtimestamp(_ms(made["next_at"]) / 1000, ZoneInfo("Europe/Berlin"))
    assert (due.hour, due.minute, made["timezone"]) == (9, 0, "Europe/Berlin")
    gone = worker.request("DELETE", f"/sessions/zoned/schedules/{made['schedule_id']}")
    assert gone.status == 200, gone.text


def _ms(iso: str) -> int:
    return int(datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _refusals_over_http(worker: DevWorker) -> None:
    """The schedules endpoints refuse on real workerd too (while "soon" waits to fire): no
    session, a bad body (nothing stored), a session token (reads only), an unknown id."""
    started = time.monotonic()

    def error(reply: Any) -> tuple[int, str]:
        return reply.status, reply.body["error"]["code"]

    ghost = worker.post("/sessions/ghost/schedules", {"message": "x", "delay_seconds": 5})
    assert error(ghost) == (404, "session-not-found"), ghost.text
    assert error(worker.get("/sessions/ghost/schedules")) == (404, "session-not-found")

    json_type = {"content-type": "application/json"}
    bad = [
        worker.request("POST", "/sessions/never/schedules", b"{", headers=json_type),
        worker.post("/sessions/never/schedules", {"message": "x", "delay_seconds": -1}),
        worker.post("/sessions/never/schedules", {"message": "x", "at": "2030-01-01T09:00"}),
        worker.post("/sessions/never/schedules", {"message": "", "delay_seconds": 5}),
        worker.post("/sessions/never/schedules", {"message": "x", "delay_seconds": 5, "y": 1}),
    ]
    assert [error(r) for r in bad] == [
        (400, "invalid-json"),
        (422, "invalid-schedule"),
        (422, "invalid-schedule"),
        (422, "invalid-body"),
        (422, "invalid-body"),
    ], [r.text for r in bad]
    assert worker.get("/sessions/never/schedules").body["schedules"] == []  # nothing stored

    minted = worker.post("/sessions/never/token", {"ttl_seconds": 120})
    assert minted.status == 200, minted.text
    token = minted.body["token"]
    listed = worker.get("/sessions/never/schedules", token=token)
    assert (listed.status, listed.body["schedules"]) == (200, []), listed.text
    made = worker.post(
        "/sessions/never/schedules", {"message": "x", "delay_seconds": 5}, token=token
    )
    assert error(made) == (403, "forbidden")
    gone = worker.request("DELETE", "/sessions/soon/schedules/sch_1", token=token)
    assert error(gone) == (403, "forbidden")  # another session's, and a cancel
    mine = worker.request("DELETE", "/sessions/never/schedules/sch_1", token=token)
    assert error(mine) == (403, "forbidden")
    assert worker.get("/sessions/soon/schedules", token=token).status == 403

    for schedule_id in ("sch_" + "0" * 32, "a%20b", "x" * 101):
        unknown = worker.request("DELETE", f"/sessions/soon/schedules/{schedule_id}")
        assert error(unknown) == (404, "schedule-not-found"), unknown.text
    wrong = worker.request("PUT", "/sessions/soon/schedules", b"{}", headers=json_type)
    allow = {k.lower(): v for k, v in wrong.headers.items()}.get("allow")
    assert (wrong.status, allow) == (405, "GET, POST"), wrong.text
    assert worker.get("/sessions/never").status == 200  # the server still answers
    print(f"refusals over HTTP: {time.monotonic() - started:.1f} s")


def test_a_step_of_120_fetching_calls_completes_on_the_free_plan(
    shared: tuple[DevWorker, ManyPosts],
) -> None:
    """Issue 20, item 5: WORKERS_PLAN=free (50 subrequests an invocation, enforced by the
    dev server as by Cloudflare): the first invocation runs the calls that fit and
    defers the rest; the object's alarm runs them in fresh invocations, each claimed
    first; every call is answered once, and every call that runs posts once."""
    worker, services = shared  # (the plan: wrangler.toml's, free)
    posts_before = len(services.posts)
    started = time.monotonic()
    first = worker.post("/sessions/many/messages", {"message": "post 120"})
    assert (first.status, first.body.get("status")) == (202, "deferred"), first.text
    messages = _wait_for(
        lambda: (m := _stored(worker, "many")) and m[-1]["content"] == "Posted: 120." and m,
        90,
        "the deferred calls",
    )
    print(f"120 calls in {time.monotonic() - started:.1f} s")
    results = [m for m in messages if m["role"] == "tool"]
    assert len(results) == 120  # every call answered, once
    kinds = [json.loads(m["content"]).get("kind") for m in results]
    # The agent's max_tool_calls_per_step (100) answers the last 20 without running them;
    # the others run in the first invocation as far as it can fetch, then in the alarm's.
    assert kinds == [None] * 100 + ["too-many-calls"] * 20, kinds
    posts = services.posts[posts_before:]
    keys = [headers.get("idempotency-key") for headers, _ in posts]
    assert len(keys) == 100
    assert len(set(keys)) == 100  # each call posted once
    texts = sorted(int(body["text"].split()[1]) for _, body in posts)
    assert texts == list(range(100))
    events = f"SELECT * FROM agent_approvals WHERE session_id = '{durable_object_id('many')}'"
    claimed = worker.count(f"{events} AND event = 'claimed'")
    deferred = worker.count(f"{events} AND event = 'approved'")
    assert 0 < claimed == deferred < 100  # the first invocation's calls needed no claim
    assert worker.get("/sessions/many").status == 200
