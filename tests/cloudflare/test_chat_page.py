"""The dev server's chat page (`GET /`, cloudflare/chat_page.html) in headless Chromium (issue 12,
item 5).

Debian's `chromium` (scripts/test installs it), driven by Playwright by its path,
against a real `scripts/dev` serving the triage example with the fake model of
worker_fakes streaming its answers in chunks 200 ms apart:

- a turn goes over the session's chat socket (`GET .../ws`, the AI SDK's
  WebSocketChatTransport frames; the token in the frames, never in the URL): a
  `send` frame, no `POST .../messages`; its tool parts show in the live bubble
  while the turn runs, and the final reply types in piece by piece; when it ends
  the stored messages (`GET /sessions/{name}`) replace the bubble: the tool calls,
  their results and the final reply render once each, in the order of the session's
  stored messages;
- a reload mid-turn: the page draws what it kept and sends a `resume` frame,
  follows the turn to its end, then loads what was stored: every message exactly once;
- a socket lost mid-turn: the page reconnects and sends `resume` with the last
  sequence it holds, gets only the chunks it missed, and ends with the stored messages;
- a second page opened on the session mid-turn shows the same turn live, and a page open
  and idle on the session shows a turn another page sends (its socket waits for it);
- hostile text (a `<script>`, an `<img onerror>`, in the message and in a tool
  result) renders as text: no script runs, no such element is made;
- Cancel mid-turn is an `abort` frame and gives `cancelled`, Resume finishes the turn;
- the refunds example waits for approval: the page's Approve button (a tool approval
  response in a `send` frame) refunds once, Deny (with a reason) refunds nothing and
  its `tool-denied` result stands out;
- a long session opens at its latest 200 messages, saying how many older ones it
  does not show, and a reload goes on from there.

A screenshot of each page is saved in the test's tmp dir.

Needs `scripts/setup-runtime` and chromium; where scripts/test could not install
chromium it says why (DURABLE_AGENTS_NO_CHROMIUM) and these tests skip with that reason.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request, WebSocket, WebSocketRoute
from tests.support.headless_chromium import browser_fixture, chromium_fixture  # noqa: F401 - fixtures
from tests.support.worker_fakes import (
    PROJECT,
    REFUNDS_AGENT,
    START_TIMEOUT_S,
    TRIAGE_AGENT,
    FakeServices,
    PaymentsAPI,
    append_turns,
    read_history,
)

from durable_agents.cloudflare.chat_page import chat_page_html
from durable_agents.testing.worker import DevWorker

pytestmark = pytest.mark.slow

TOKEN = "test-token"
CHUNK_DELAY_S = 0.2  # a turn of three streamed answers runs for seconds
TURN_TIMEOUT_MS = 60_000
# Whether the page made a message element for each stored message, once, in order.
POSITIONS_JS = "() => [...document.querySelectorAll('#transcript .msg[data-position]')]" \
    ".map((m) => Number(m.dataset.position))"  # fmt: skip


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fakes:
        fakes.chunk_delay = CHUNK_DELAY_S
        yield fakes


@pytest.fixture(scope="module")
def worker(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    dev = DevWorker(
        PROJECT,
        tmp_path_factory.mktemp("chat-page") / "state",
        settings={**services.worker_env(), "CHAT_PAGE": "on"},
        agent=TRIAGE_AGENT,
        token=TOKEN,
        start_timeout=START_TIMEOUT_S,
    )
    dev.start()
    try:
        yield dev
    finally:
        dev.close()


class Tab:
    """One page in a fresh browser context (its own sessionStorage), recording every
    request it sends, every WebSocket it opens and the frames it sends on them, and
    every script error, dialog and console error it meets."""

    def __init__(self, browser: Browser, worker: DevWorker) -> None:
        self.context = browser.new_context(viewport={"width": 1000, "height": 860})
        self.page: Page = self.context.new_page()
        self.worker = worker
        self.requests: list[Request] = []
        self.sockets: list[WebSocket] = []
        self.frames: list[dict[str, Any]] = []  # sent by the page, in order
        self.received: list[dict[str, Any]] = []  # the frames the page got, in order
        self.page.on("websocket", self._socket)
        self.script_errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request))
        self.page.on("pageerror", lambda error: self.script_errors.append(str(error)))
        self.page.on("dialog", self._dialog)

    def _socket(self, socket: WebSocket) -> None:
        self.sockets.append(socket)
        socket.on("framesent", lambda payload: self.frames.append(json.loads(payload)))
        socket.on("framereceived", lambda payload: self.received.append(json.loads(payload)))

    def sent(self, kind: str) -> list[dict[str, Any]]:
        """The frames of type `kind` the page sent (but the `resume`s of `watches`)."""
        return [f for f in self.frames if f.get("type") == kind and f not in self.watches()]

    def watches(self) -> list[dict[str, Any]]:
        """The `resume` frames that wait for the session's next turn (an idle page's)."""
        return [
            f for f in self.frames
            if f.get("type") == "resume" and (f.get("body") or {}).get("waitForTurn") is True
        ]  # fmt: skip

    def posted(self, suffix: str) -> list[Request]:
        """The page's POST requests to this session's `suffix` (like `/messages`)."""
        return [
            r for r in self.requests
            if r.method == "POST" and r.url.endswith(f"/sessions/{self.session}{suffix}")
        ]  # fmt: skip

    def wait_live(self, selector: str) -> None:
        """Until the live bubble shows `selector` (mid-turn)."""
        self.page.wait_for_selector(f"#live {selector}", timeout=TURN_TIMEOUT_MS)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self) -> None:
        self.page.goto(f"{self.worker.url}/#token={TOKEN}")
        # The token is taken from the fragment, kept, and gone from the address bar.
        assert "token" not in self.page.url
        assert self.page.evaluate("sessionStorage.getItem('durable-agents:token')") == TOKEN
        self.wait_idle()

    def wait_idle(self) -> None:
        """Until the page's first stream (the session's events) has ended."""
        self.page.wait_for_function(
            "() => document.getElementById('status').dataset.status !== 'running'"
            " && !document.getElementById('send').disabled",
            timeout=TURN_TIMEOUT_MS,
        )

    def open_session(self, name: str) -> None:
        """Shows session `name` (as a person types it in)."""
        self.page.fill("#session", name)
        self.page.dispatch_event("#session", "change")

    @property
    def session(self) -> str:
        return self.page.input_value("#session")

    def send(self, text: str) -> None:
        self.page.fill("#message", text)
        self.page.click("#send")

    def wait_status(self, status: str) -> None:
        self.page.wait_for_selector(f'#status[data-status="{status}"]', timeout=TURN_TIMEOUT_MS)

    def positions(self) -> list[int]:
        positions: list[int] = self.page.evaluate(POSITIONS_JS)
        return positions

    def stored(self) -> list[dict[str, Any]]:
        """The session's messages as the API has them."""

        def get(path: str) -> Any:
            answer = self.worker.get(path)
            assert answer.status == 200, answer.text
            return answer.body

        return read_history(get, self.session)

    def assert_shows_exactly(self, stored: list[dict[str, Any]]) -> None:
        """One message element per stored message, in order, of the stored role."""
        positions = self.positions()
        assert len(positions) == len(set(positions)), f"a message shown twice: {positions}"
        assert positions == list(range(len(stored)))
        roles = self.page.eval_on_selector_all(
            "#transcript .msg[data-position]", "(ms) => ms.map((m) => m.dataset.role)"
        )
        assert roles == [m["role"] for m in stored]
        assert self.page.locator("#live, #sent").count() == 0

    def screenshot(self, path: Path) -> None:
        self.page.screenshot(path=str(path), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Browser, worker: DevWorker) -> Iterator[Tab]:
    opened = Tab(browser, worker)
    try:
        yield opened
    finally:
        opened.close()
    assert opened.script_errors == []


def test_the_page_is_served_without_auth(worker: DevWorker) -> None:
    answer = worker.get("/", token="")
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/html")
    assert 'id="transcript"' in answer.text
    assert answer.text == chat_page_html()  # the file as it is, read inside the Worker


def test_a_turn_goes_over_the_chat_socket(tab: Tab, tmp_path: Path) -> None:
    tab.open()
    tab.send("Please triage issue 42")
    # A tool part is on screen while the turn still runs (its final reply not yet stored).
    tab.wait_live(".tool-call .arguments")
    assert tab.page.get_attribute("#status", "data-status") == "running"
    # What was sent shows at once, stored or not yet.
    assert tab.page.text_content("#sent .text") == "Please triage issue 42"
    assert tab.page.locator("#live .tool-call .name").first.text_content() == "get_issue"
    assert tab.page.is_enabled("#cancel")
    tab.screenshot(tmp_path / "chat-page-streaming.png")
    # The final reply types in: a piece of it is on screen before the rest.
    final = "Triaged issue 42 and posted to #triage."
    typed = tab.page.wait_for_function(
        """(full) => {
            const texts = [...document.querySelectorAll('#live .text')].map((t) => t.textContent);
            const typed = texts.find((t) => t.startsWith('Triaged'));
            return typed && typed.length < full.length ? typed : null;
        }""",
        arg=final,
        timeout=TURN_TIMEOUT_MS,
    ).json_value()
    assert final.startswith(typed)
    tab.screenshot(tmp_path / "chat-page-typing.png")

    tab.wait_status("complete")
    stored = tab.stored()
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant", "tool",
                                           "assistant"]  # fmt: skip
    tab.assert_shows_exactly(stored)
    page = tab.page
    assert page.text_content('.msg[data-position="0"] .text') == "Please triage issue 42"
    calls = page.locator(".tool-call")
    assert calls.locator(".name").all_text_contents() == ["get_issue", "post_slack"]
    assert '"id": "42"' in (calls.nth(0).locator(".arguments").text_content() or "")
    results = page.locator('.msg[data-role="tool"]')
    assert results.locator(".name").all_text_contents() == ["get_issue", "post_slack"]
    assert '"title": "Login fails (42)"' in (results.nth(0).locator(".result").text_content() or "")
    assert page.text_content('.msg[data-position="5"] .text') == final
    assert page.is_disabled("#cancel")
    # The turn went over one socket of the session, without the token in its URL.
    (socket,) = tab.sockets
    assert socket.url.endswith(f"/sessions/{tab.session}/ws")
    assert TOKEN not in socket.url
    (frame,) = tab.sent("send")
    assert frame["headers"] == {"authorization": f"Bearer {TOKEN}"}
    (message,) = frame["messages"]
    assert message["role"] == "user"
    assert message["parts"] == [{"type": "text", "text": "Please triage issue 42"}]
    assert message["id"] == frame["messageId"]
    assert tab.posted("/messages") == []
    assert not [r.url for r in tab.requests if r.url.endswith("/events")]
    # What the page keeps for a reload: the transcript and the last position.
    key = f"durable-agents:transcript:{tab.session}"
    kept = page.evaluate("(key) => JSON.parse(sessionStorage.getItem(key))", key)
    assert kept["lastId"] == 5
    assert sorted(kept["messages"], key=int) == [str(i) for i in range(6)]
    tab.screenshot(tmp_path / "chat-page.png")


def test_a_wrong_token_is_said_and_the_message_given_back(tab: Tab) -> None:
    tab.page.goto(f"{tab.worker.url}/#token=not-the-token")
    tab.wait_status("error")  # the opening `resume` frame, refused
    assert "unauthorized" in (tab.page.text_content("#errors") or "")
    tab.send("Please triage issue 3")
    tab.page.wait_for_function(
        "() => document.getElementById('message').value === 'Please triage issue 3'",
        timeout=TURN_TIMEOUT_MS,
    )  # refused, not stored: given back to be sent again
    assert tab.page.get_attribute("#status", "data-status") == "error"
    assert tab.page.locator("#sent, #live").count() == 0
    assert len(tab.sent("send")) == 1
    assert tab.worker.get(f"/sessions/{tab.session}").status == 404  # nothing was stored


def test_a_reload_mid_turn_resumes_over_the_socket(tab: Tab, tmp_path: Path) -> None:
    tab.open()
    tab.send("Please triage issue 7")
    tab.wait_live(".tool-call")
    assert tab.page.get_attribute("#status", "data-status") == "running"  # mid-turn
    assert len(tab.sent("send")) == 1
    resumes = len(tab.sent("resume"))
    tab.page.reload()

    tab.wait_live(".tool-call")  # the reply so far, replayed, then followed
    tab.wait_status("complete")
    (resume,) = tab.sent("resume")[resumes:]
    assert "lastSequence" not in resume  # a reloaded page holds none of the reply
    assert resume["headers"] == {"authorization": f"Bearer {TOKEN}"}
    assert len(tab.sent("send")) == 1  # the reload sent no message again
    stored = tab.stored()
    assert len(stored) == 6
    tab.assert_shows_exactly(stored)
    assert tab.page.text_content('.msg[data-position="5"] .text') == (
        "Triaged issue 7 and posted to #triage."
    )
    tab.screenshot(tmp_path / "chat-page-after-reload.png")


def test_a_socket_lost_mid_turn_resumes_from_its_last_sequence(tab: Tab) -> None:
    routes: list[tuple[WebSocketRoute, WebSocketRoute]] = []  # (the page's, the server's)

    def through(route: WebSocketRoute) -> None:
        routes.append((route, route.connect_to_server()))

    tab.page.route_web_socket(re.compile(r".*/ws$"), through)
    tab.open()
    tab.send("Please triage issue 13")
    tab.wait_live(".tool-call .result")
    page_side, server_side = routes[-1]
    page_side.close()  # the page's socket goes away mid-turn
    server_side.close()
    tab.wait_status("complete")
    held = [f["sequence"] for f in tab.received if f["type"] == "chunk"]
    (resume,) = tab.sent("resume")[1:]  # (the first: the page's opening)
    assert resume["lastSequence"] >= 0
    first = held[: held.index(resume["lastSequence"]) + 1]
    assert first == list(range(len(first)))  # what the page had when it lost the socket
    assert held[len(first) :] == list(range(len(first), len(held)))  # then only what it missed
    assert len(tab.sent("send")) == 1
    stored = tab.stored()
    assert stored[-1]["content"] == "Triaged issue 13 and posted to #triage."
    tab.assert_shows_exactly(stored)


def test_two_pages_on_one_session_show_the_turn(
    tab: Tab, browser: Browser, worker: DevWorker
) -> None:
    tab.open()
    tab.send("Please triage issue 11")
    tab.wait_live(".tool-call")
    other = Tab(browser, worker)
    try:
        other.open()  # a session of its own, then the first page's
        other.open_session(tab.session)
        other.wait_live(".tool-call")  # the same turn, live, on the other page
        assert other.page.get_attribute("#status", "data-status") == "running"
        tab.wait_status("complete")
        other.wait_status("complete")
        stored = tab.stored()
        assert stored[-1]["content"] == "Triaged issue 11 and posted to #triage."
        tab.assert_shows_exactly(stored)
        other.assert_shows_exactly(stored)
        assert other.sent("send") == []  # it followed: one turn, run once
        assert len(stored) == 6
    finally:
        other.close()
    assert other.script_errors == []


def test_an_idle_page_shows_a_turn_another_page_sends(
    tab: Tab, browser: Browser, worker: DevWorker
) -> None:
    tab.open()
    other = Tab(browser, worker)
    try:
        other.open()
        other.open_session(tab.session)
        other.wait_idle()
        deadline = time.monotonic() + TURN_TIMEOUT_MS / 1000
        while not other.watches() and time.monotonic() < deadline:
            other.page.wait_for_timeout(50)
        assert other.watches(), other.frames  # its socket waits for the session's next turn
        tab.send("Please triage issue 21")
        other.wait_live(".tool-call")  # the first page's turn, live, with no reload
        assert other.page.get_attribute("#status", "data-status") == "running"
        tab.wait_status("complete")
        other.wait_status("complete")
        stored = tab.stored()
        assert stored[-1]["content"] == "Triaged issue 21 and posted to #triage."
        other.assert_shows_exactly(stored)
        assert other.sent("send") == []  # it only watched: one turn, run once
        assert other.posted("/messages") == []
    finally:
        other.close()
    assert other.script_errors == []


def test_a_long_session_opens_at_its_latest_messages(tab: Tab, tmp_path: Path) -> None:
    made = tab.worker.post("/sessions/long-chat/messages", {"message": "triage issue 5"})
    assert made.status == 200, made.body
    count = append_turns(tab.worker, made.body["session_id"], 60)
    assert count == 306
    tab.open()
    asked_at = len(tab.requests)
    tab.open_session("long-chat")
    tab.page.wait_for_selector('#transcript .msg[data-position="305"]', timeout=TURN_TIMEOUT_MS)
    tab.wait_idle()
    assert tab.positions() == list(range(106, 306))
    assert tab.page.get_attribute("#older", "data-count") == "106"
    assert "106 older messages are not shown" in (tab.page.text_content("#older") or "")
    asked = [(r.method, r.url.split("/sessions/")[-1]) for r in tab.requests[asked_at:]]
    assert asked == [("GET", "long-chat?limit=1"), ("GET", "long-chat?after=105")], asked
    assert tab.page.get_attribute("#status", "data-status") == "complete"
    tab.page.evaluate("window.scrollTo(0, 0)")
    tab.page.screenshot(path=str(tmp_path / "chat-page-long-top.png"))  # the note, on top

    reloaded_at = len(tab.requests)
    tab.page.reload()  # what it kept is drawn, the loading goes on from its last position
    tab.wait_idle()
    assert tab.positions() == list(range(106, 306))
    assert tab.page.locator("#older").count() == 1
    again = [r for r in tab.requests[reloaded_at:] if "/sessions/" in r.url]
    assert [r.url.split("/sessions/")[-1] for r in again] == ["long-chat?after=305"]


HOSTILE = '<script>window.__pwned = "script"</script><img src=x onerror="window.__pwned = \'img\'">'


def test_hostile_text_renders_as_text(tab: Tab, services: FakeServices, tmp_path: Path) -> None:
    # The issue's title (a tool result, then a tool call's argument) is hostile too.
    services.issue_bodies["66"] = (
        b'{"id": "66", "title": "<img src=x onerror=\\"window.__pwned = \'title\'\\">"}'
    )
    tab.open()
    message = f"Triage issue 66 {HOSTILE}"
    tab.send(message)
    tab.wait_status("complete")

    page = tab.page
    assert page.text_content('.msg[data-position="0"] .text') == message
    assert "<img src=x onerror=" in (page.text_content('.msg[data-position="2"] .result') or "")
    assert "<img src=x onerror=" in (page.text_content(".tool-call >> nth=1") or "")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#transcript script, #transcript img, main img").count() == 0
    assert not [r.url for r in tab.requests if r.url.rstrip("/").endswith("/x")]
    assert tab.dialogs == []
    tab.assert_shows_exactly(tab.stored())
    tab.screenshot(tmp_path / "chat-page-hostile.png")


def test_cancel_mid_turn_aborts_then_resume(tab: Tab) -> None:
    tab.open()
    tab.send("Please triage issue 9")
    tab.wait_live(".tool-call")
    tab.page.click("#cancel")
    tab.wait_status("cancelled")
    (send,) = tab.sent("send")
    (abort,) = tab.sent("abort")
    assert abort["requestId"] == send["requestId"]  # the running request, aborted
    assert tab.posted("/cancel") == []
    assert tab.page.is_enabled("#resume")
    stopped = tab.stored()
    assert stopped[-1]["role"] != "assistant" or stopped[-1].get("tool_calls")  # not finished
    tab.assert_shows_exactly(stopped)

    tab.page.click("#resume")
    tab.wait_status("complete")
    stored = tab.stored()
    assert stored[-1]["content"] == "Triaged issue 9 and posted to #triage."
    tab.assert_shows_exactly(stored)


@pytest.fixture(scope="module")
def refunds_worker(
    payments: PaymentsAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevWorker]:
    """The refunds example (its offline model; issue_refund needs approval)."""
    dev = DevWorker(
        PROJECT,
        tmp_path_factory.mktemp("chat-page-refunds") / "state",
        settings={"PAYMENTS_API_URL": payments.url, "CHAT_PAGE": "on"},
        agent=REFUNDS_AGENT,
        token=TOKEN,
        start_timeout=START_TIMEOUT_S,
    )
    dev.start()
    try:
        yield dev
    finally:
        dev.close()


def test_approve_and_deny_from_the_page(
    browser: Browser, refunds_worker: DevWorker, payments: PaymentsAPI, tmp_path: Path
) -> None:
    tab = Tab(browser, refunds_worker)
    try:
        tab.open()
        page = tab.page
        before = len(payments.refund_requests)
        tab.send("refund order 7")
        tab.wait_status("awaiting_approval")
        (pending,) = refunds_worker.get(f"/sessions/{tab.session}/approvals").body["pending"]
        card = page.locator(f'.approval[data-tool-call-id="{pending["tool_call_id"]}"]')
        assert card.locator(".name").text_content() == "issue_refund"
        assert '"order_id": "7"' in (card.locator(".arguments").text_content() or "")
        assert len(payments.refund_requests) == before  # nothing refunded before the decision
        tab.screenshot(tmp_path / "chat-page-awaiting-approval.png")
        shown = tab.positions()
        tab.send("and order 9 too")  # refused while a call waits: shown, given back
        tab.wait_status("error")
        assert "approval-pending" in (page.text_content("#errors") or "")
        assert page.input_value("#message") == "and order 9 too"
        assert tab.positions() == shown
        assert page.locator("#sent").count() == 0
        assert card.count() == 1  # still waiting for a decision
        page.reload()  # the page finds the waiting call again (GET .../approvals says so)
        tab.wait_status("awaiting_approval")
        assert card.locator(".name").text_content() == "issue_refund"
        sends = len(tab.sent("send"))
        card.locator(".approve").click()
        tab.wait_status("complete")
        tab.screenshot(tmp_path / "chat-page-approved.png")
        assert page.locator(".approval").count() == 0
        assert len(payments.refund_requests) == before + 1  # the call ran once
        # The decision went over the socket: the tool approval response, with the digest.
        (decision,) = tab.sent("send")[sends:]
        (answered,) = decision["messages"]
        assert answered["role"] == "assistant"
        (part,) = answered["parts"]
        assert part["toolCallId"] == pending["tool_call_id"]
        assert part["approval"] == {
            "id": f"{pending['tool_call_id']}:{pending['digest']}", "approved": True,
        }  # fmt: skip
        assert tab.posted(f"/approvals/{pending['tool_call_id']}") == []
        assert tab.posted("/messages") == []
        stored = tab.stored()
        tab.assert_shows_exactly(stored)
        assert "Refunded 49.99 on order 7" in stored[-1]["content"]
        assert (
            page.text_content(f'.msg[data-position="{len(stored) - 1}"] .text')
            == (stored[-1]["content"])
        )

        page.click("#new-session")
        tab.wait_idle()
        assert tab.positions() == []
        tab.send("refund order 8")
        tab.wait_status("awaiting_approval")
        page.fill(".approval .reason", "bob: outside the refund window")
        page.click(".approval .deny")
        tab.wait_status("complete")
        assert len(payments.refund_requests) == before + 1  # the denied refund never ran
        denied = page.locator('.msg[data-role="tool"][data-kind="tool-denied"]')
        assert denied.count() == 1
        assert denied.locator(".kind").text_content() == "tool-denied"
        assert "bob: outside the refund window" in (denied.locator(".result").text_content() or "")
        stored = tab.stored()
        tab.assert_shows_exactly(stored)
        assert "denied (bob: outside the refund window)" in stored[-1]["content"]
        tab.screenshot(tmp_path / "chat-page-denied.png")
    finally:
        tab.close()
    assert tab.script_errors == []
