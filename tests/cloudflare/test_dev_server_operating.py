"""Operating sessions over HTTP against `scripts/dev` (the Worker, its Durable Objects and
D1 on workerd, as `wrangler dev` runs them): a listing of 10,000 sessions paged while
sessions are written, the timeline page of a crashed-and-resumed session (looked at in
Chromium), delete, session tokens, retention fired as `wrangler dev --test-scheduled`
fires it (GET /cdn-cgi/handler/scheduled), the spend limit, and a long session read in
pages (its history, its timeline followed link by link in Chromium, its events)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser
from tests.support.headless_chromium import browser_fixture, chromium_fixture  # noqa: F401 - fixtures
from tests.support.worker_fakes import (
    DURABILITY_REPLY,
    DevServer,
    FakeServices,
    append_turns,
    read_history,
)

from durable_agents.testing.worker import DevWorker

SECRET = "an-operator-secret-of-more-than-32-bytes"
RETENTION_DAYS = 0.00003  # 2.6 s: sessions idle longer go when the cron fires


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


def start(services: FakeServices, state_dir: Path, **settings: str) -> DevServer:
    env = {**services.worker_env(), "API_TOKEN": "test-token", **settings}
    return DevServer(state_dir, env).start()


@pytest.fixture(scope="module")
def dev(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = start(
        services, tmp_path_factory.mktemp("operating"),
        SESSION_TOKEN_SECRET=SECRET, RETENTION_DAYS=str(RETENTION_DAYS),
    )  # fmt: skip
    try:
        yield server
    finally:
        server.kill_all()


@pytest.fixture
def worker(dev: DevServer, services: FakeServices) -> DevWorker:
    """The module's server, running (the crash test kills it and starts it again; a test
    that failed while it was down left it down), and the fakes as new."""
    services.reset()
    if not dev.worker.running:
        dev.worker.restart()
    return dev.worker


def triage(worker: DevWorker, name: str, issue: int = 1) -> dict[str, Any]:
    answer = worker.post(f"/sessions/{name}/messages", {"message": f"triage issue {issue}"})
    assert answer.status == 200, answer.body
    body: dict[str, Any] = answer.body
    return body


CROSS_REQUEST_IO = "Cannot perform I/O on behalf of a different request"


def all_pages(worker: DevWorker, limit: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        page = worker.get(f"/sessions{query}")
        if page.status == 500 and CROSS_REQUEST_IO in (page.text or ""):
            # workerd, rarely, under concurrent requests to one isolate (twice in ~40 runs):
            # miniflare's text/plain 500, not the kit's JSON. A GET: asked again, once.
            print(f"listing: workerd's cross-request I/O error, asked again: {page.text[:200]}")
            page = worker.get(f"/sessions{query}")
        assert page.status == 200, f"{page.status} {page.headers}\n{page.text}"
        rows += page.body["sessions"]
        cursor = page.body["next_cursor"]
        if cursor is None:
            return rows


def test_10000_sessions_page_with_no_duplicates_or_gaps_while_sessions_are_written(
    worker: DevWorker, tmp_path: Path
) -> None:
    # 10,000 stored sessions, written straight into the local D1 (a turn each would take
    # minutes): ids and names unique, created over ~3 hours, some sharing a created_at.
    base = 1_700_000_000_000
    statements = []
    for chunk in range(0, 10_000, 500):
        values = ",".join(
            f"('bulk{i:05d}','triage','complete',2,{base + (i // 3) * 1000},"
            f"{base + (i // 3) * 1000},'bulk-{i:05d}',11,7)"
            for i in range(chunk, chunk + 500)
        )
        statements.append(
            "INSERT INTO agent_sessions (id, agent_name, state, message_count, created_at, "
            f"updated_at, name, input_tokens, output_tokens) VALUES {values};"
        )
    sql = tmp_path / "bulk.sql"
    sql.write_text("\n".join(statements))
    worker.wrangler(
        "d1", "execute", worker.database, "--local", "--file", str(sql),
        "--persist-to", str(worker.state_dir),
    )  # fmt: skip

    stop = threading.Event()
    written: list[str] = []

    def write_sessions() -> None:  # new sessions, and new messages on existing ones
        n = 0
        while not stop.is_set():
            name = f"live-{n}"
            worker.post(f"/sessions/{name}/messages", {"message": f"triage issue {n}"})
            written.append(name)
            n += 1

    writer = threading.Thread(target=write_sessions, daemon=True)
    writer.start()
    try:
        started = time.perf_counter()
        rows = all_pages(worker, 200)
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        writer.join(60)
    bulk = [r["name"] for r in rows if r["name"].startswith("bulk-")]
    assert len(bulk) == len(set(bulk)) == 10_000  # every one, once
    keys = [(r["created_at"], r["session_id"]) for r in rows]
    assert keys == sorted(keys, reverse=True)  # newest created first, throughout
    assert written, "the writer wrote nothing while the listing paged"
    print(f"\n10,000 sessions in {len(rows) // 200 + 1} pages of 200: {elapsed:.2f} s "
          f"while {len(written)} sessions were written")  # fmt: skip


def test_the_timeline_of_a_crashed_and_resumed_session_shows_the_repaired_call(
    dev: DevServer, worker: DevWorker, services: FakeServices, tmp_path: Path, browser: Browser
) -> None:
    # The module's server: killed and started again on its state, for the tests after it.
    services.hold_posts = True  # the post lands, the webhook holds its answer: then kill -9
    pending = worker.start_post("/sessions/crashed/messages", {"message": "triage issue 9"})
    assert services.post_received.wait(60)
    dev.crash()
    assert pending.exception(30) is not None  # the server died before answering
    services.hold_posts = False
    services.release_posts.set()
    worker.restart()
    resumed = worker.post("/sessions/crashed/resume")
    assert resumed.body["response"] == DURABILITY_REPLY

    view = worker.get("/sessions/crashed/view")
    assert view.status == 200
    assert view.headers["content-type"].startswith("text/html")
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 900}
    )
    try:
        page = context.new_page()
        page.set_content(view.text)
        repaired = page.locator('article[data-kind="tool-durability-error"]')
        assert repaired.count() == 1
        assert "post_slack" in repaired.inner_text()
        assert "safe_to_retry" in repaired.inner_text()
        assert page.locator("script").count() == 0
        page.screenshot(path=str(tmp_path / "timeline-crashed.png"), full_page=True)
        print(f"\nscreenshot: {tmp_path / 'timeline-crashed.png'}")
    finally:
        context.close()
    assert len(services.posts) == 1


def test_delete_then_the_session_reads_as_404_and_is_not_listed(worker: DevWorker) -> None:
    triage(worker, "to-delete")
    deleted = worker.request("DELETE", "/sessions/to-delete")
    assert deleted.status == 200, deleted.body
    assert deleted.body["deleted"] is True
    assert worker.get("/sessions/to-delete").status == 404
    assert worker.request("DELETE", "/sessions/to-delete").status == 404
    session_id = deleted.body["session_id"]
    assert worker.count(f"SELECT 1 FROM agent_messages WHERE session_id = '{session_id}'") == 0
    assert worker.count(f"SELECT 1 FROM agent_sessions WHERE id = '{session_id}'") == 0


def test_a_session_token_talks_to_its_session_only(worker: DevWorker) -> None:
    minted = worker.post("/sessions/browser-1/token", {"ttl_seconds": 120})
    assert minted.status == 200, minted.body
    token = minted.body["token"]
    mine = worker.post("/sessions/browser-1/messages", {"message": "triage issue 2"}, token=token)
    assert mine.status == 200, mine.body
    assert worker.get("/sessions/browser-1", token=token).status == 200
    assert worker.get("/sessions/browser-2", token=token).status == 403
    assert worker.get("/sessions", token=token).status == 403
    assert worker.request("DELETE", "/sessions/browser-1", token=token).status == 403
    assert worker.post("/sessions/browser-1/token", token=token).status == 403
    assert worker.get("/sessions/browser-1", token=token[:-2] + "xx").status == 401
    assert token not in "\n".join(worker.lines)  # never logged


def test_retention_fired_by_the_cron_deletes_only_idle_sessions(worker: DevWorker) -> None:
    triage(worker, "idle-one")
    time.sleep(RETENTION_DAYS * 86400 + 0.5)

    def fire() -> None:
        fired = worker.request("GET", "/cdn-cgi/handler/scheduled?cron=17+*+*+*+*", token="")
        assert (fired.status, fired.text) == (200, "ok")

    # one cron run deletes at most 800 sessions, oldest first (the listing test left 10,000
    # idle ones in this database): fire it as the hourly trigger would, until it is done
    for _ in range(20):
        fire()
        if worker.get("/sessions/idle-one").status == 404:
            break
    assert worker.get("/sessions/idle-one").status == 404
    triage(worker, "fresh-one")
    fire()
    assert worker.get("/sessions/fresh-one").status == 200  # written just now: kept


def test_the_spend_limit_stops_a_turn_and_a_raised_one_lets_resume_finish(
    services: FakeServices, tmp_path: Path
) -> None:
    # the fake model reports 18 tokens per call: the second call of the turn is over 30
    server = start(services, tmp_path / "state", MAX_SESSION_TOKENS="30")
    try:
        worker = server.worker
        stopped = worker.post("/sessions/spender/messages", {"message": "triage issue 3"})
        assert stopped.status == 200, stopped.body
        assert stopped.body["status"] == "budget_exceeded"
        assert stopped.body["error"]["code"] == "budget-exceeded"
        listed = worker.get("/sessions?limit=1").body["sessions"][0]
        assert listed["usage"]["input_tokens"] + listed["usage"]["output_tokens"] == 36
        server.stop()
        server.worker.env = {**server.worker.env, "MAX_SESSION_TOKENS": "1000"}
        worker.restart()
        resumed = worker.post("/sessions/spender/resume")
        assert resumed.body["status"] == "complete", resumed.body
    finally:
        server.kill_all()


def test_listing_refuses_bad_parameters(worker: DevWorker) -> None:
    assert worker.get("/sessions?limit=0").status == 400
    bad = worker.get("/sessions?cursor=%22%3E%3Cscript%3E")
    assert (bad.status, bad.body["error"]["code"]) == (400, "invalid-cursor")


def test_a_long_session_reads_in_pages(worker: DevWorker, browser: Browser, tmp_path: Path) -> None:
    session_id = triage(worker, "paged")["session_id"]
    count = append_turns(worker, session_id, 90)
    assert count == 456

    # GET: pages of 200 chained by `next`, every position once; the most a page holds.
    timings: list[tuple[float, int]] = []

    def get(path: str) -> Any:
        started = time.perf_counter()
        answer = worker.get(path)
        timings.append((time.perf_counter() - started, len(answer.text)))
        assert answer.status == 200, answer.body
        return answer.body

    history = read_history(get, "paged")
    assert len(history) == 456
    assert [m["role"] for m in history[6:11]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert len(timings) == 3  # 200, 200, 56
    assert all(seconds < 3 and size < 3_000_000 for seconds, size in timings), timings
    whole = worker.get("/sessions/paged?limit=1000")
    assert (len(whole.body["messages"]), whole.body["next"]) == (456, None)
    assert worker.get("/sessions/paged?after=455").body["messages"] == []
    for bad in ("limit=1001", "limit=0", "after=-1", "limit=x"):
        answer = worker.get(f"/sessions/paged?{bad}")
        assert (answer.status, answer.body["error"]["code"]) == (400, "invalid-request"), bad

    # /events: the whole history replayed in chunks, each position once, then `done`.
    with worker.stream("GET", "/sessions/paged/events", headers={"last-event-id": "5"}) as events:
        got = list(events)
    assert [int(e.id or -1) for e in got if e.event == "message"] == list(range(6, 456))
    assert [e.data for e in got if e.event == "message"] == history[6:]
    assert (got[-1].event, got[-1].data["status"]) == ("done", "complete")

    # /view: the latest page, then older and newer by its links, in Chromium (no JavaScript,
    # the token sent with every request as a client would).
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 900},
        extra_http_headers={"Authorization": "Bearer test-token"},
    )  # fmt: skip
    try:
        page = context.new_page()

        def shown() -> list[int]:
            positions = page.locator("article").evaluate_all(
                "(es) => es.map((e) => Number(e.dataset.position))"
            )
            return [int(p) for p in positions]

        started = time.perf_counter()
        answer = page.goto(f"{worker.url}/sessions/paged/view")
        seconds = time.perf_counter() - started
        assert answer is not None
        assert answer.status == 200
        assert seconds < 3
        assert len(answer.body()) < 3_000_000
        assert shown() == list(range(356, 456))
        top = page.locator("nav.pages-top")
        assert top.locator(".range").inner_text() == "Messages #356 to #455 of 456"
        assert top.locator("a.older").get_attribute("href") == "?before=356&limit=100"
        assert top.locator("a.newer").count() == 0  # the latest page
        page.screenshot(path=str(tmp_path / "timeline-latest.png"))  # its top

        top.locator("a.older").click()
        page.wait_for_load_state()
        assert page.url.endswith("/sessions/paged/view?before=356&limit=100")
        assert shown() == list(range(256, 356))
        assert top.locator("a.newer").get_attribute("href") == "?after=355&limit=100"
        page.screenshot(path=str(tmp_path / "timeline-older.png"))
        page.screenshot(path=str(tmp_path / "timeline-older-whole.png"), full_page=True)
        page.locator("nav.pages-bottom a.newer").click()
        page.wait_for_load_state()
        assert shown() == list(range(356, 456))
        top.locator("a.first").click()
        page.wait_for_load_state()
        assert shown() == list(range(100))
        assert page.locator("section.turn").first.get_attribute("data-turn") == "1"
        assert top.locator("a.older").count() == 0
        print(f"\nscreenshots: {tmp_path}; GET pages (s, bytes): {timings}")
    finally:
        context.close()
