"""The session timeline page (`durable_agents.timeline.render_timeline`, issue 13 item 2).

Unit tests of its HTML (parsed with the standard library's HTMLParser): every
stored text escaped, kinds, pending approvals, usage sums, no script at all.
Then a triage-like session built on CPython with a crash that loses a
`post_slack` result (resumed with `run(message=None)`, so the call is repaired
with a `tool-durability-error`), rendered to a file and opened in headless
Debian chromium with JavaScript disabled: DOM assertions and a screenshot. A page
of a longer session (`TimelinePage`): its positions, the links to the pages around
it, a step split by the page's end, in HTML and in chromium. Messages no client wrote
(`Message.origin`): a scheduled turn, a self-resumed resume and a turn ended by
`stop_turn`, built on SQLite, their badges and the stop note in HTML and in chromium.
A parent's agent-tool call and its child session, linked both ways (issue 34 item 3): in
HTML, from a SQLite store, and followed by clicks in chromium.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser
from pydantic import BaseModel
from tests.support.delegated_sessions import CALL, CHILD, PARENT, store_delegated_sessions
from tests.support.headless_chromium import browser_fixture, chromium_fixture  # noqa: F401 - fixtures

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    Usage,
    run,
    schedule,
    stop_turn,
    tool,
)
from durable_agents.errors import ToolDurabilityError
from durable_agents.messages import ParentCall, ToolErrorKind, tool_error_content
from durable_agents.session_links import LinkedSession, SessionLinks, find_links, view_href
from durable_agents.stores import Store, sqlite_store
from durable_agents.stores.base import ApprovalEvent, SessionInfo
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_on_write
from durable_agents.testing.conformance import ticking_clock
from durable_agents.timeline import TimelinePage, render_timeline

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"
T0 = 1_800_000_000_000  # 2027-01-15 08:00:00 UTC


# -- a parsed page ---------------------------------------------------------------------------


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.texts: list[str] = []

    def text(self) -> str:
        return "".join(self.texts) + "".join(c.text() for c in self.children)

    def iter(self) -> list[Element]:
        return [self, *(e for c in self.children for e in c.iter())]

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Element]:
        return [
            e
            for e in self.iter()
            if (tag is None or e.tag == tag)
            and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


VOID = {"meta", "link", "br", "img", "hr", "input"}


class Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.current = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, self.current)
        self.current.children.append(element)
        if tag not in VOID:
            self.current = element

    def handle_endtag(self, tag: str) -> None:
        node: Element | None = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        assert node is not None, f"stray </{tag}>"
        assert node.parent is not None
        self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.texts.append(data)


def parse(page: str) -> Element:
    parser = Parser()
    parser.feed(page)
    parser.close()
    assert parser.current is parser.root, f"unclosed <{parser.current.tag}>"
    return parser.root


def render(messages: Sequence[Message], approvals: Sequence[ApprovalEvent] = (), **kw: Any) -> str:
    entries = [(T0 + 1000 * i, m) for i, m in enumerate(messages)]
    args: dict[str, Any] = {"name": "s1", "session_id": "a" * 64, "agent": "triage", **kw}
    return render_timeline(entries=entries, approvals=approvals, **args)


def article(root: Element, position: int) -> Element:
    (found,) = root.find_all("article", data_position=str(position))
    return found


# -- unit tests of the HTML ------------------------------------------------------------------


def test_every_stored_text_is_escaped_and_there_is_no_script() -> None:
    call = ToolCall("c<1>", f"x{HOSTILE}", {"text": HOSTILE, HOSTILE: 1})
    messages = [
        Message.user(f"hi {HOSTILE}"),
        Message.assistant(f"ok {HOSTILE}", [call]),
        Message.tool_result(call, json.dumps({"title": HOSTILE})),
        Message.assistant(HOSTILE),
    ]
    page = render(messages, name=f"n{HOSTILE}", session_id=f'"{HOSTILE}', agent=HOSTILE)
    assert "<script" not in page.lower()
    assert "<img" not in page.lower()
    root = parse(page)
    assert root.find_all("script") == []
    assert root.find_all("img") == []
    assert HOSTILE in article(root, 0).text()
    assert HOSTILE in article(root, 1).text()  # text, tool name and arguments
    (shown_call,) = article(root, 1).find_all(data_call_id="c<1>")
    assert shown_call.attrs["data-tool"] == f"x{HOSTILE}"
    assert json.loads(shown_call.find_all("pre")[0].text()) == call.arguments
    assert json.loads(article(root, 2).find_all("pre")[0].text()) == {"title": HOSTILE}
    assert HOSTILE in root.find_all("h1")[0].text()
    assert HOSTILE in root.find_all("title")[0].text()
    # No handler attribute, no javascript: URL, no external resource.
    for element in root.iter():
        for key, value in element.attrs.items():
            assert not key.startswith("on"), (element.tag, key)
            assert not value.lower().startswith(("javascript:", "http:", "https:", "//"))
    assert "Content-Security-Policy" in page
    assert "default-src 'none'" in page


def test_the_style_sheet_is_inlined_and_stored_dollars_stay_text() -> None:
    # The page is timeline.html with timeline.css in its <style>; its `$slots` are
    # filled once, so a stored `$name` is never taken for one.
    css = (resources.files("durable_agents") / "timeline.css").read_text(encoding="utf-8")
    page = render([Message.user("$title ${css} $$")], name="$name", session_id="$turns")
    root = parse(page)
    assert [style.text() for style in root.find_all("style")] == [f"\n{css}"]
    assert [link.attrs for link in root.find_all("link")] == [{"rel": "icon", "href": "data:,"}]
    assert article(root, 0).find_all("div")[0].text() == "$title ${css} $$"
    assert root.find_all("h1")[0].text() == "$name"
    assert "<code>$turns</code>" in page


def test_messages_have_anchors_roles_kinds_and_turns() -> None:
    a, b = ToolCall("c1", "get_issue", {"id": "42"}), ToolCall("c2", "post_slack", {})
    messages = [
        Message.user("triage 42"),
        Message.assistant("", [a, b], usage=Usage(100, 10)),
        Message.tool_result(a, '{"id": "42"}'),
        Message.tool_result(b, tool_error_content(ToolErrorKind.TOOL_FAILED, "Tool failed: boom")),
        Message.assistant("done", usage=Usage(200, 20)),
        Message.user("again"),
        Message.assistant("sure", usage=Usage(50, 5)),
    ]
    root = parse(render(messages))
    articles = root.find_all("article")
    assert [e.attrs["id"] for e in articles] == [f"m{i}" for i in range(7)]
    assert [e.attrs["data-role"] for e in articles] == [m.role for m in messages]
    assert [e.attrs["data-kind"] for e in articles] == [
        "user", "tool-calls", "tool-result", "tool-failed", "reply", "user", "reply",
    ]  # fmt: skip
    turns = root.find_all("section", **{"class": "turn"})
    assert [t.attrs["data-turn"] for t in turns] == ["1", "2"]
    assert [len(t.find_all("article")) for t in turns] == [5, 2]
    assert root.find_all("main")
    assert "2027-01-15 08:00:00 UTC" in articles[0].text()
    assert "Tool failed" in articles[3].text()
    # each call links to its result, each result to its call
    assert [e.attrs["href"] for e in articles[1].find_all("a", **{"class": "result-link"})] == [
        "#m2",
        "#m3",
    ]
    assert any(e.attrs.get("href") == "#m1" for e in articles[3].find_all("a"))


def test_usage_per_turn_and_in_total() -> None:
    messages = [
        Message.user("one"),
        Message.assistant("", [ToolCall("c1", "t", {})], usage=Usage(100, 10)),
        Message("tool", "{}", tool_call_id="c1", tool_name="t"),
        Message.assistant("a", usage=Usage(1000, 200)),
        Message.user("two"),
        Message.assistant("b", usage=Usage(7, 3)),
    ]
    root = parse(render(messages))

    def tokens(element: Element) -> tuple[int, int]:
        found = element.find_all("span", **{"class": "tokens"})[0]
        return int(found.attrs["data-input-tokens"]), int(found.attrs["data-output-tokens"])

    turns = root.find_all("section", **{"class": "turn"})
    assert [tokens(t) for t in turns] == [(1100, 210), (7, 3)]
    assert tokens(root.find_all("dl")[0]) == (1107, 213)
    assert "1,107 in · 213 out tokens" in root.find_all("dl")[0].text()


def test_a_repaired_call_stands_out_with_why() -> None:
    call = ToolCall("c9", "post_slack", {"channel": "#triage", "text": "hi"})
    lost = ToolDurabilityError("post_slack", "c9").to_content()
    messages = [
        Message.user("go"),
        Message.assistant("", [call]),
        Message.tool_result(call, lost),
        Message.assistant("It may have posted; please check."),
    ]
    root = parse(render(messages))
    repaired = article(root, 2)
    assert repaired.attrs["data-kind"] == "tool-durability-error"
    assert "tone-crash" in repaired.attrs["class"]
    text = " ".join(repaired.text().split())
    assert "Repaired after a crash" in text
    assert (
        "requested before a crash; no result was stored, so it was not run again because "
        "post_slack is not safe_to_retry" in text
    )
    assert "the process stopped before its result was stored" in text  # the stored error
    # listed at the top, linking to it
    (attention,) = root.find_all("section", **{"class": "attention"})
    assert [a.attrs["href"] for a in attention.find_all("a")] == ["#m2"]
    assert "Repaired after a crash" in attention.text()


def test_a_timed_out_unsafe_call_is_an_unknown_outcome_not_a_crash() -> None:
    call = ToolCall("c1", "post_slack", {})
    error = ToolDurabilityError(
        "post_slack", "c1", "Tool 'post_slack' (call c1) did not finish within 30 s and was stopped"
    )
    root = parse(render([Message.user("go"), Message.assistant("", [call]),
                         Message.tool_result(call, error.to_content())]))  # fmt: skip
    text = article(root, 2).text()
    assert "Outcome unknown" in text
    assert "timed out" in text
    assert "crash" not in text.lower()


def test_denials_other_kinds_and_unknown_errors() -> None:
    calls = [ToolCall(f"c{i}", f"t{i}", {}) for i in range(4)]
    denied = tool_error_content(
        ToolErrorKind.TOOL_DENIED, "denied", toolName="t0", toolCallId="c0", reason=HOSTILE
    )
    messages = [
        Message.user("go"),
        Message.assistant("", calls),
        Message.tool_result(calls[0], denied),
        Message.tool_result(calls[1], tool_error_content(ToolErrorKind.UNKNOWN_TOOL, "no")),
        Message.tool_result(calls[2], json.dumps({"error": "custom", "kind": "mine", "hint": "x"})),
        Message.tool_result(calls[3], "plain <b>text</b>"),
    ]
    root = parse(render(messages))
    assert [article(root, p).attrs["data-kind"] for p in range(2, 6)] == [
        "tool-denied", "unknown-tool", "mine", "tool-result",
    ]  # fmt: skip
    assert "Denied" in article(root, 2).text()
    assert f"reason: {HOSTILE}" in article(root, 2).text()
    assert "Unknown tool" in article(root, 3).text()
    assert "Tool error" in article(root, 4).text()
    assert json.loads(article(root, 4).find_all("pre")[0].text()) == {"hint": "x"}
    assert article(root, 2).find_all("pre") == []  # name, id and reason are shown already
    assert article(root, 5).find_all("b") == []
    assert "plain <b>text</b>" in article(root, 5).text()


def _event(call: ToolCall, event: str, ms: int, reason: str | None = None) -> ApprovalEvent:
    return ApprovalEvent(call.id, event, call.name, "0123456789abcdef" * 4, reason, ms)  # type: ignore[arg-type]


def test_pending_approvals_show_with_their_digest_prefix() -> None:
    refund, close, other = (
        ToolCall("r1", "refund", {"amount": 5}),
        ToolCall("r2", "close_issue", {}),
        ToolCall("r3", "post", {}),
    )
    messages = [Message.user("go"), Message.assistant("", [refund, close, other])]
    events = [
        _event(refund, "requested", T0),
        _event(close, "requested", T0),
        _event(close, "approved", T0 + 5),
    ]
    root = parse(render(messages, events))
    calls = {e.attrs["data-call-id"]: e for e in article(root, 1).find_all("div")
             if "data-call-id" in e.attrs}  # fmt: skip
    assert calls["r1"].attrs["data-kind"] == "pending-approval"
    assert "Awaiting approval" in calls["r1"].text()
    assert "digest 0123456789ab…" in calls["r1"].text()
    assert calls["r2"].attrs["data-kind"] == "approved-not-run"
    assert calls["r3"].attrs["data-kind"] == "no-result"
    assert "tone-pending" in article(root, 1).attrs["class"]
    (attention,) = root.find_all("section", **{"class": "attention"})
    assert [li.attrs["data-kind"] for li in attention.find_all("li")] == [
        "pending-approval", "approved-not-run", "no-result",
    ]  # fmt: skip


def edited_session() -> tuple[list[Message], list[ApprovalEvent]]:
    """A turn sent computed instructions, a summary that keeps them, and a refund a person
    approved with edited arguments (then claimed and run)."""
    refund = ToolCall("r1", "refund", {"order_id": "A-1", "amount_cents": 1500})
    edit = {"order_id": "A-1", "amount_cents": 500, "note": HOSTILE}
    messages = [
        Message("user", "old question", instructions="Be brief."),
        Message.assistant("old answer"),
        Message("system", "the old question was answered", summary_of=2, instructions="Be brief."),
        Message("user", "refund A-1", instructions=f"Refund at most 10 €. {HOSTILE}"),
        Message.assistant("", [refund]),
        Message.tool_result(refund, '{"refunded_cents": 500}'),
        Message.assistant("Refunded 5 €."),
    ]
    digest, edited = "0123456789abcdef" * 4, "fedcba9876543210" * 4
    events = [
        ApprovalEvent("r1", "requested", "refund", digest, None, T0),
        ApprovalEvent("r1", "approved", "refund", digest, "ann: half", T0 + 1, edit, edited),
        ApprovalEvent("r1", "claimed", "refund", digest, None, T0 + 2),
    ]
    return messages, events


def test_an_edited_approval_shows_the_models_arguments_and_the_edit() -> None:
    messages, events = edited_session()
    root = parse(render(messages, events))
    (call,) = article(root, 4).find_all("div", data_call_id="r1")
    assert call.attrs["data-edited"] == "true"
    assert "arguments edited" in call.text()
    (asked,) = call.find_all("div", **{"class": "asked"})
    (edit,) = call.find_all("div", **{"class": "edit"})
    assert json.loads(asked.find_all("pre")[0].text()) == messages[4].tool_calls[0].arguments
    assert json.loads(edit.find_all("pre")[0].text()) == events[1].arguments
    assert "digest fedcba987654…" in edit.text()
    assert HOSTILE in edit.text()  # escaped, as every stored text
    # A plain approval shows one version, as before.
    plain = [events[0], ApprovalEvent("r1", "approved", "refund", events[0].digest, None, T0)]
    (unedited,) = article(parse(render(messages, plain)), 4).find_all("div", data_call_id="r1")
    assert "data-edited" not in unedited.attrs
    assert unedited.find_all("div", **{"class": "edit"}) == []


def test_the_instructions_a_turn_was_sent_are_one_collapsed_line() -> None:
    messages, events = edited_session()
    root = parse(render(messages, events))
    for position, sent in ((0, "Be brief."), (2, "Be brief."), (3, messages[3].instructions)):
        (details,) = article(root, position).find_all("details", **{"class": "instructions"})
        assert "open" not in details.attrs  # one line until opened
        assert details.find_all("summary")[0].text().startswith("Instructions the turn was sent")
        assert details.find_all("pre")[0].text() == sent
    assert article(root, 2).attrs["data-kind"] == "summary"
    for position in (1, 4, 5, 6):  # no instructions stored: no line
        assert article(root, position).find_all("details") == []


def test_a_quiet_session_and_an_empty_one() -> None:
    root = parse(render([Message.user("hi"), Message.assistant("hello")]))
    assert root.find_all(data_kind="all-clear")
    assert root.find_all("section", **{"class": "attention"}) == []
    empty = parse(render([]))
    assert "no stored messages" in empty.text()


def test_long_texts_fold_open() -> None:
    root = parse(render([Message.user("x" * 5000)]))
    (details,) = article(root, 0).find_all("details")
    assert "open" in details.attrs
    assert "5,000 characters" in details.text()


def test_messages_no_client_wrote_carry_their_origin() -> None:
    lost = ToolCall("c1", "deploy", {})
    messages = [
        Message.user("hello"),
        Message.assistant("Hi."),
        Message("user", "Check the build", request_key="schedule:sch_1", origin="scheduled"),
        Message("assistant", "It is green.", origin="scheduled"),
        Message.user("deploy"),
        Message.assistant("", [lost]),
        Message.tool_result(lost, ToolDurabilityError("deploy", "c1").to_content()),
        Message("assistant", "It may have deployed.", origin="self-resumed"),
    ]
    root = parse(render(messages))
    articles = root.find_all("article")
    assert [a.attrs.get("data-origin") for a in articles] == [
        None, None, "scheduled", "scheduled", None, None, None, "self-resumed",
    ]  # fmt: skip
    for element in articles:
        origin = element.attrs.get("data-origin")
        badges = element.find_all("span", data_origin=origin or "")
        if origin is None:
            assert badges == []
            assert "origin-" not in element.attrs["class"]
            continue
        (badge,) = badges
        assert badge.attrs["class"] == f"badge origin origin-{origin}"
        assert badge.text() == origin
        assert badge.attrs["title"]  # says why
        (header,) = element.find_all("header")
        assert badge in header.children  # beside who wrote it
        assert f"origin-{origin}" in element.attrs["class"].split()
    # A scheduled turn is marked in its heading; a reply stored by a resume marks its turn.
    turns = root.find_all("section", **{"class": "turn"})
    assert [t.attrs.get("data-origins") for t in turns] == [None, "scheduled", "self-resumed"]
    assert [b.text() for b in turns[1].find_all("h2")[0].find_all(data_origin="scheduled")] == [
        "scheduled"
    ]
    # Origins are marks, not alarms: nothing here needs attention but the repaired call.
    (attention,) = root.find_all("section", **{"class": "attention"})
    assert [a.attrs["href"] for a in attention.find_all("a")] == ["#m6"]
    # The scheduled turn's message names the schedule it came from.
    (source,) = articles[2].find_all("span", **{"class": "scheduled-by"})
    assert source.text() == "from schedule sch_1"


def test_a_recurring_schedules_turn_names_its_rule_and_occurrence() -> None:
    key = "schedule:sch_9@1800000000000"
    messages = [
        Message.user("hello"),
        Message.assistant("Hi."),
        Message("user", "Daily digest", request_key=key, origin="scheduled"),
        Message("assistant", "Here it is.", origin="scheduled"),
    ]
    articles = parse(render(messages)).find_all("article")
    (source,) = articles[2].find_all("span", **{"class": "scheduled-by"})
    assert source.text() == (
        "from recurring schedule sch_9, occurrence due 2027-01-15T08:00:00.000Z"
    )
    assert articles[3].find_all("span", **{"class": "scheduled-by"}) == []


def test_the_stop_note_stands_out_and_is_listed() -> None:
    a, b = ToolCall("c1", "post", {}), ToolCall("c2", "fetch", {})
    reason = "Stopped: resuming this turn kept crashing <b>3</b> times."
    messages = [
        Message.user("go"),
        Message.assistant("", [a, b]),
        Message.tool_result(a, ToolDurabilityError("post", "c1").to_content()),
        Message.tool_result(b, ToolDurabilityError("fetch", "c2").to_content()),
        Message("assistant", reason, origin="stopped"),
    ]
    page = render(messages)
    root = parse(page)
    note = article(root, 4)
    assert note.attrs["data-kind"] == "stopped"
    assert note.attrs["data-origin"] == "stopped"
    assert "tone-stopped" in note.attrs["class"]
    text = " ".join(note.text().split())
    assert "Stopped by durable-agents" in text
    assert "Turn stopped" in text
    assert "the next message starts a new turn" in text
    assert reason in text  # the stored reason, as text
    assert "<b>3</b>" not in page
    (badge,) = note.find_all(data_origin="stopped")[1:]  # the article, then its badge
    # What stop_turn answered as lost says so, safe_to_retry or not (fetch is).
    for lost in (article(root, 2), article(root, 3)):
        why = " ".join(lost.find_all("span", **{"class": "why"})[0].text().split())
        assert "Lost, turn stopped" in lost.text()
        assert "the turn was stopped (resuming it kept crashing) instead of running it" in why
        assert "safe_to_retry" not in why
    assert badge.text() == "stopped"
    (attention,) = root.find_all("section", **{"class": "attention"})
    items = attention.find_all("li")
    assert [(li.attrs["data-kind"], li.find_all("a")[0].attrs["href"]) for li in items] == [
        ("tool-durability-error", "#m2"),
        ("tool-durability-error", "#m3"),
        ("stopped", "#m4"),
    ]
    assert [b.text() for b in items[2].find_all("span", **{"class": "badge"})] == ["Turn stopped"]
    assert "at message 4" in items[2].text()
    assert items[2].find_all("code") == []
    (turn,) = root.find_all("section", **{"class": "turn"})
    assert turn.attrs["data-origins"] == "stopped"
    assert "3 to check" in turn.text()


# -- a page of a longer session ----------------------------------------------------------------

LINKS = {
    "first": "?before=4&limit=4",
    "older": "?before=40&limit=4",
    "newer": "?after=43&limit=4",
    "latest": "?limit=4",
}


def paged(**kw: Any) -> str:
    """Positions 40 to 43 of a session of 60: a result, a reply, a question, a step whose
    results (44, 45) are on the next page."""
    calls = [ToolCall("c8a", "get_issue", {"id": "8"}), ToolCall("c8b", "post_slack", {})]
    messages = [
        Message("tool", '{"id": "7"}', tool_call_id="c7", tool_name="get_issue"),
        Message.assistant("Issue 7 is triaged.", usage=Usage(5, 1)),
        Message.user("triage 8"),
        Message.assistant("", calls, usage=Usage(7, 2)),
    ]
    following = [
        (44, Message.tool_result(calls[0], '{"id": "8"}')),
        (45, Message.tool_result(calls[1], tool_error_content(ToolErrorKind.TOOL_FAILED, "no"))),
    ]
    session = SessionInfo("a" * 64, "triage", "complete", 60, T0 - 5000, T0 + 99_000,
                          "s1", 1234, 56)  # fmt: skip
    page = TimelinePage(40, LINKS, following)
    return render(messages, page=page, session=session, **kw)


def test_a_page_of_a_longer_session_links_the_pages_around_it() -> None:
    text = paged()
    root = parse(text)
    assert [a.attrs["id"] for a in root.find_all("article")] == ["m40", "m41", "m42", "m43"]
    navs = root.find_all("nav", **{"class": "pages pages-top"}) + root.find_all(
        "nav", **{"class": "pages pages-bottom"}
    )
    assert len(navs) == 2
    for nav in navs:
        assert (nav.attrs["data-first"], nav.attrs["data-last"], nav.attrs["data-total"]) == (
            "40", "43", "60",
        )  # fmt: skip
        hrefs = {a.attrs["class"]: a.attrs["href"] for a in nav.find_all("a")}
        assert hrefs == LINKS
        assert nav.find_all("a", rel="prev")[0].attrs["class"] == "older"
        assert nav.find_all("a", rel="next")[0].attrs["class"] == "newer"
        assert "Messages #40 to #43 of 60" in nav.text()
    facts = root.find_all("dl")[0].text()
    assert "Messages60" in facts  # the session's count, times and usage, not the page's
    assert "Turns" not in facts  # not known from a page
    assert "1,234 in · 56 out tokens" in facts
    assert "#40 to #43" in root.find_all("title")[0].text()
    # The result whose call is on the page before; the call whose results come after.
    assert 'answers a call on <a href="?before=40&amp;limit=4">an earlier page</a>' in text
    assert article(root, 40).find_all("a")[-1].attrs["href"] == LINKS["older"]
    turns = root.find_all("section", **{"class": "turn"})
    assert [t.attrs.get("data-turn") for t in turns] == [None, None]
    assert [t.attrs["data-start"] for t in turns] == ["40", "42"]
    assert "Continued from the page before" in turns[0].text()
    results = [a.attrs["href"] for a in article(root, 43).find_all("a", **{"class": "result-link"})]
    assert results == [LINKS["newer"] + "#m44", LINKS["newer"] + "#m45"]
    assert "Tool failed" in article(root, 43).text()  # the next page's result, summed up
    assert root.find_all(data_kind="no-result") == []  # answered on the next page
    assert "Nothing on this page needs attention" in root.text()


def test_the_first_and_the_last_page_link_one_way() -> None:
    session = SessionInfo("a" * 64, "triage", "complete", 3, T0, T0, "s1")
    messages = [Message.user("q"), Message.assistant("", [ToolCall("c1", "t", {})]),
                Message("tool", "{}", tool_call_id="c1", tool_name="t")]  # fmt: skip
    first = parse(
        render(messages[:2], page=TimelinePage(0, {"newer": "?after=1"}), session=session)
    )
    (nav,) = first.find_all("nav", **{"class": "pages pages-top"})
    assert [a.attrs["class"] for a in nav.find_all("a")] == ["newer"]
    assert [s.attrs["class"] for s in nav.find_all("span")] == [
        "first off", "older off", "range", "latest off",
    ]  # fmt: skip
    assert [t.attrs["data-turn"] for t in first.find_all("section", **{"class": "turn"})] == ["1"]
    # A call whose result is on no page shown and not in `following`: a link, not a flag.
    (link,) = article(first, 1).find_all("a", **{"class": "result-link"})
    assert (link.attrs["href"], link.text()) == ("?after=1", "result: on a later page")
    assert first.find_all(data_kind="no-result") == []
    last = parse(
        render(messages[2:], page=TimelinePage(2, {"older": "?before=2"}), session=session)
    )
    assert [a.attrs["id"] for a in last.find_all("article")] == ["m2"]
    empty = parse(render([], page=TimelinePage(3, {"latest": "?limit=100"}), session=session))
    assert "No messages here: the session holds #0 to #2." in empty.text()
    assert "No messages on this page" in empty.text()


def test_a_page_in_chromium_without_javascript(browser: Browser, tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text(paged(), encoding="utf-8")
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 700}
    )
    try:
        page = context.new_page()
        page.goto(path.as_uri())
        top = page.locator("nav.pages-top")
        assert top.is_visible()
        assert top.locator("a.older").get_attribute("href") == LINKS["older"]
        assert top.locator("a.newer").get_attribute("href") == LINKS["newer"]
        assert top.locator(".range").inner_text() == "Messages #40 to #43 of 60"
        box = top.locator("a.older").bounding_box()
        assert box is not None
        assert box["height"] > 10  # a button-like link, not hidden
        page.screenshot(path=str(tmp_path / "timeline-page.png"), full_page=True)
        print(f"screenshot: {tmp_path / 'timeline-page.png'}")
    finally:
        context.close()


def test_an_edit_and_instructions_in_chromium_without_javascript(
    browser: Browser, tmp_path: Path
) -> None:
    messages, events = edited_session()
    path = tmp_path / "edited.html"
    path.write_text(render(messages, events), encoding="utf-8")
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 900}
    )
    try:
        page = context.new_page()
        page.goto(path.as_uri())
        call = page.locator('div.call[data-edited="true"]')
        assert call.count() == 1
        asked, edit = call.locator(".asked pre"), call.locator(".edit pre")
        assert asked.is_visible()
        assert edit.is_visible()
        assert json.loads(asked.inner_text())["amount_cents"] == 1500
        assert json.loads(edit.inner_text())["amount_cents"] == 500
        # The edit, the version that runs, comes after the model's and stands apart.
        asked_box, edit_box = asked.bounding_box(), edit.bounding_box()
        assert asked_box is not None
        assert edit_box is not None
        assert edit_box["y"] > asked_box["y"] + asked_box["height"] - 1
        assert call.locator(".edit").evaluate("(e) => getComputedStyle(e).borderLeftStyle") == (
            "solid"
        )
        assert call.locator(".badge.tone-edited").inner_text() == "arguments edited"
        # Instructions: one line, their text hidden until opened.
        line = page.locator("article#m3 details.instructions")
        assert line.locator("summary").is_visible()
        assert not line.locator("pre").is_visible()
        line.locator("summary").click()
        assert line.locator("pre").is_visible()
        assert line.locator("pre").inner_text() == messages[3].instructions
        page.screenshot(path=str(tmp_path / "timeline-edited.png"), full_page=True)
        print(f"screenshot: {tmp_path / 'timeline-edited.png'}")
    finally:
        context.close()


# -- a crashed and resumed triage session, in chromium with JavaScript off -------------------


class IssueRef(BaseModel):
    id: str


class SlackPost(BaseModel):
    channel: str
    text: str


@tool(safe_to_retry=True)
async def get_issue(args: IssueRef) -> dict[str, str]:
    """Fetch an issue (a pure read)."""
    return {"id": args.id, "title": f"Login fails {HOSTILE}", "status": "open"}


@tool
async def post_slack(args: SlackPost) -> dict[str, bool]:
    """Post to Slack (a side effect)."""
    return {"ok": True}


@tool(requires_approval=True)
async def close_issue(args: IssueRef) -> dict[str, bool]:
    """Close an issue (needs a person's approval)."""
    return {"closed": True}


TRIAGE = Agent("triage", "Triage issues.", [get_issue, post_slack, close_issue])
SESSION = "triage-42"
SUMMARY = f"#42 Login fails {HOSTILE}: open"


async def build_triage_session(store: Store) -> None:
    """Turn 1 crashes before post_slack's result is stored and is resumed (the call is
    repaired); turn 2 asks for an unknown tool; turn 3 waits for an approval."""
    post = ToolCall("call-post", "post_slack", {"channel": "#triage", "text": SUMMARY})
    llm = ScriptedLLM([
        LLMResponse("Fetching the issue.", [ToolCall("call-get", "get_issue", {"id": "42"})],
                    Usage(812, 24)),
        LLMResponse("Posting a summary.", [post], Usage(951, 41)),
        LLMResponse("The post to #triage may already have gone out (the process stopped "
                    "while posting): please check the channel before I post again.",
                    usage=Usage(1204, 38)),
        LLMResponse("", [ToolCall("call-x", f"page_oncall{HOSTILE}", {"who": HOSTILE})],
                    Usage(1300, 20)),
        LLMResponse("I cannot page on-call: there is no such tool.", usage=Usage(1350, 15)),
        LLMResponse("Closing it needs your approval.", [ToolCall("call-close", "close_issue",
                    {"id": "42"})], Usage(1400, 22)),
    ])  # fmt: skip
    # Appends: 1 user + get_issue call, 2 its result, 3 the post_slack call, 4 its result.
    with pytest.raises(SimulatedCrash):
        await run(TRIAGE, llm=llm, message=f"Please triage issue 42 {HOSTILE}",
                  session_id=SESSION, store=crash_on_write(store, 4))  # fmt: skip
    resumed = await run(TRIAGE, llm=llm, message=None, session_id=SESSION, store=store)
    assert resumed.status == "complete"
    done = await run(TRIAGE, llm=llm, message="Page on-call too", session_id=SESSION, store=store)
    assert done.status == "complete"
    waiting = await run(TRIAGE, llm=llm, message="Close it", session_id=SESSION, store=store)
    assert waiting.status == "awaiting_approval"


@pytest.fixture(scope="module")
def triage_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    async def make(db: Path) -> str:
        store = sqlite_store(db, clock=ticking_clock())
        try:
            await build_triage_session(store)
            return render_timeline(
                name=SESSION,
                session_id=SESSION,
                agent="triage",
                entries=await store.load_timeline(SESSION),
                approvals=await store.load_approvals(SESSION),
            )
        finally:
            await store.close()

    folder = tmp_path_factory.mktemp("timeline")
    path = folder / "timeline.html"
    # In a thread of its own: Playwright's sync API may already run a loop in this one.
    with ThreadPoolExecutor(1) as thread:
        page = thread.submit(asyncio.run, make(folder / "agents.db")).result()
    path.write_text(page, encoding="utf-8")
    return path


def test_the_triage_page_parses(triage_page: Path) -> None:
    root = parse(triage_page.read_text(encoding="utf-8"))
    kinds = [a.attrs["data-kind"] for a in root.find_all("article")]
    assert kinds == [
        "user", "tool-calls", "tool-result", "tool-calls", "tool-durability-error", "reply",
        "user", "tool-calls", "unknown-tool", "reply",
        "user", "tool-calls",
    ]  # fmt: skip
    assert root.find_all("script") == []


def test_the_triage_page_in_chromium_without_javascript(
    browser: Browser,
    triage_page: Path,
    tmp_path: Path,
) -> None:
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 900}
    )
    try:
        page = context.new_page()
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(triage_page.as_uri())
        assert requests == [triage_page.as_uri()]  # nothing else fetched
        assert page.locator("script").count() == 0
        assert page.locator("img").count() == 0
        positions = [
            int(p) for p in page.locator("article").evaluate_all(
                "(es) => es.map((e) => e.dataset.position)")
        ]  # fmt: skip
        assert positions == list(range(12))
        turns = page.locator("section.turn").evaluate_all("(ss) => ss.map((s) => s.dataset.turn)")
        assert turns == ["1", "2", "3"]

        repaired = page.locator('article[data-kind="tool-durability-error"]')
        assert repaired.count() == 1
        assert repaired.get_attribute("id") == "m4"
        label = repaired.locator(".flag .label")
        why = repaired.locator(".flag .why")
        assert label.is_visible()
        assert why.is_visible()
        assert label.inner_text().lower() == "repaired after a crash"
        assert why.inner_text().startswith(
            "requested before a crash; no result was stored, so it was not run again "
            "because post_slack is not safe_to_retry"
        )
        # It stands out: its own colour, unlike a plain result.
        plain = page.locator('article[data-kind="tool-result"]').first
        assert repaired.evaluate("(e) => getComputedStyle(e).borderTopColor") != plain.evaluate(
            "(e) => getComputedStyle(e).borderTopColor"
        )
        # Listed at the top, linking to it; the call links to it too.
        attention = page.locator("section.attention")
        assert attention.is_visible()
        assert attention.locator('a[href="#m4"]').count() == 1
        assert page.locator('article#m3 a.result-link[href="#m4"]').count() == 1
        pending = page.locator('div.call[data-kind="pending-approval"]')
        assert pending.count() == 1
        assert pending.is_visible()
        assert "awaiting approval" in pending.inner_text().lower()
        assert re.search(r"digest [0-9a-f]{12}…", pending.inner_text())
        assert page.locator('article[data-kind="unknown-tool"]').is_visible()

        # Hostile text is text, wherever it was stored.
        assert HOSTILE in page.locator("#m0").inner_text()
        assert HOSTILE in page.locator("#m2").inner_text()  # a tool result
        assert HOSTILE in page.locator("#m3").inner_text()  # tool arguments
        assert f"page_oncall{HOSTILE}" in page.locator("#m7").inner_text()  # a tool name

        # An anchor reaches a message without JavaScript.
        page.goto(triage_page.as_uri() + "#m4")
        assert page.evaluate("() => window.scrollY") > 0
        page.goto(triage_page.as_uri())
        page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=str(tmp_path / "timeline-dark.png"), full_page=True)
        print(f"screenshots: {tmp_path}")
    finally:
        context.close()


# -- scheduled, self-resumed and stopped turns, in chromium -------------------------------------


class Check(BaseModel):
    what: str


@tool
async def deploy(args: Check) -> dict[str, bool]:
    """Deploy (a side effect)."""
    return {"deployed": True}


@tool(safe_to_retry=True)
async def check_ci(args: Check) -> dict[str, str]:
    """Read the CI status."""
    return {"build": "green", "what": args.what}


@tool(safe_to_retry=True)
async def post_notes(args: Check) -> dict[str, bool]:
    """Post the release notes (dies every time: the process is killed mid-call)."""
    raise SimulatedCrash("killed while posting")


OPS = Agent("ops", "Run releases.", [deploy, check_ci, post_notes])
OPS_SESSION = "release-7"
STOP_NOTE = (
    "This turn was stopped: resuming it crashed 3 times in a row, so nothing more of it "
    "was run. Send a new message to go on."
)


async def build_origins_session(store: Store) -> None:
    """Turn 1 a client's; turn 2 a schedule's; turn 3 crashes before deploy's result is
    stored and is resumed by nobody's request (self-resumed); turn 4's resumes crash
    every time and it is stopped."""
    llm = ScriptedLLM([
        LLMResponse("I will check the build in an hour.", usage=Usage(420, 18)),
        LLMResponse("", [ToolCall("call-ci", "check_ci", {"what": "main"})], Usage(510, 16)),
        LLMResponse("The build of main is green.", usage=Usage(560, 12)),
        LLMResponse("Deploying.", [ToolCall("call-deploy", "deploy", {"what": "v7"})],
                    Usage(600, 20)),
        LLMResponse("The deploy of v7 may have happened before the restart: please check "
                    "before I deploy again.", usage=Usage(650, 30)),
        LLMResponse("", [ToolCall("call-notes", "post_notes", {"what": "v7"})], Usage(700, 15)),
    ])  # fmt: skip
    await run(OPS, llm=llm, message="Check the build in an hour", session_id=OPS_SESSION,
              store=store)  # fmt: skip
    made = await schedule(store, OPS_SESSION, "Check the build of main", delay_seconds=3600)
    fired = await run(OPS, llm=llm, message=made.message, request_key=made.request_key,
                      origin="scheduled", session_id=OPS_SESSION, store=store)  # fmt: skip
    assert fired.status == "complete"
    with pytest.raises(SimulatedCrash):
        await run(OPS, llm=llm, message="Deploy v7", session_id=OPS_SESSION,
                  store=crash_on_write(store, 2))  # fmt: skip
    resumed = await run(OPS, llm=llm, message=None, session_id=OPS_SESSION, store=store,
                        origin="self-resumed")  # fmt: skip
    assert resumed.status == "complete"
    with pytest.raises(SimulatedCrash):
        await run(OPS, llm=llm, message="Post the release notes", session_id=OPS_SESSION,
                  store=store)  # fmt: skip
    with pytest.raises(SimulatedCrash):  # post_notes is safe_to_retry: run again, dies again
        await run(OPS, llm=llm, message=None, session_id=OPS_SESSION, store=store,
                  origin="self-resumed")  # fmt: skip
    stopped = await stop_turn(OPS, store=store, session_id=OPS_SESSION, reason=STOP_NOTE)
    assert stopped.error_code == "turn-stopped"


@pytest.fixture(scope="module")
def origins_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    async def make(db: Path) -> str:
        store = sqlite_store(db, clock=ticking_clock())
        try:
            await build_origins_session(store)
            return render_timeline(
                name=OPS_SESSION,
                session_id=OPS_SESSION,
                agent="ops",
                entries=await store.load_timeline(OPS_SESSION),
                approvals=await store.load_approvals(OPS_SESSION),
                session=await store.get_session(OPS_SESSION),
            )
        finally:
            await store.close()

    folder = tmp_path_factory.mktemp("origins")
    path = folder / "origins.html"
    with ThreadPoolExecutor(1) as thread:
        page = thread.submit(asyncio.run, make(folder / "agents.db")).result()
    path.write_text(page, encoding="utf-8")
    return path


def test_the_origins_page_parses(origins_page: Path) -> None:
    root = parse(origins_page.read_text(encoding="utf-8"))
    shown = [(a.attrs["data-kind"], a.attrs.get("data-origin")) for a in root.find_all("article")]
    assert shown == [
        ("user", None), ("reply", None),
        ("user", "scheduled"), ("tool-calls", "scheduled"), ("tool-result", "scheduled"),
        ("reply", "scheduled"),
        ("user", None), ("tool-calls", None),
        ("tool-durability-error", "self-resumed"), ("reply", "self-resumed"),
        ("user", None), ("tool-calls", None),
        ("tool-durability-error", None),  # answered by stop_turn, not run again
        ("stopped", "stopped"),
    ]  # fmt: skip
    turns = root.find_all("section", **{"class": "turn"})
    assert [t.attrs.get("data-origins") for t in turns] == [
        None, "scheduled", "self-resumed", "stopped",
    ]  # fmt: skip


def test_the_origins_page_in_chromium_without_javascript(
    browser: Browser, origins_page: Path, tmp_path: Path
) -> None:
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 900}
    )
    try:
        page = context.new_page()
        page.goto(origins_page.as_uri())
        for origin, first in (("scheduled", 2), ("self-resumed", 8), ("stopped", 13)):
            badge = page.locator(f"article#m{first} > header .badge.origin")
            assert badge.is_visible()
            assert badge.inner_text() == origin
            box = badge.bounding_box()
            who = page.locator(f"article#m{first} > header .who").bounding_box()
            assert box is not None
            assert who is not None
            # Beside who wrote it: on the same line, just after it.
            assert abs(box["y"] - who["y"]) < who["height"]
            assert 0 <= box["x"] - (who["x"] + who["width"]) < 20
            heading = page.locator(f'section.turn[data-origins~="{origin}"] > h2 .badge.origin')
            assert heading.inner_text() == origin
        # Each origin has its own colour, and none is the ink of plain text.
        colours = {
            origin: page.locator(
                f'article > header .badge.origin[data-origin="{origin}"]'
            ).first.evaluate("(e) => getComputedStyle(e).color")
            for origin in ("scheduled", "self-resumed", "stopped")
        }
        ink = page.locator("article#m0 > header .who").evaluate("(e) => getComputedStyle(e).color")
        assert len(set(colours.values())) == 3, colours
        assert ink not in colours.values()
        # The stop note stands out: its own border, a banner saying why, listed at the top.
        note = page.locator("article#m13")
        reply = page.locator("article#m1")
        assert note.evaluate("(e) => getComputedStyle(e).borderTopWidth") == "2px"
        assert reply.evaluate("(e) => getComputedStyle(e).borderTopWidth") == "1px"
        assert note.locator(".flag .label").inner_text().lower() == "turn stopped"
        assert note.locator(".flag .why").is_visible()
        assert STOP_NOTE in note.inner_text()
        assert page.locator('section.attention li[data-kind="stopped"] a[href="#m13"]').count() == 1
        lost = page.locator("article#m12 .flag .label")  # post_notes, answered by stop_turn
        assert lost.inner_text().lower() == "lost, turn stopped"
        assert page.locator("article#m8 .flag .label").inner_text().lower() == (
            "repaired after a crash"  # a plain repair, by a resume
        )
        # A scheduled user message is told apart from a client's at a glance.
        scheduled = page.locator("article#m2")
        client = page.locator("article#m0")
        assert scheduled.evaluate("(e) => getComputedStyle(e).borderLeftColor") != client.evaluate(
            "(e) => getComputedStyle(e).borderLeftColor"
        )
        page.screenshot(path=str(tmp_path / "timeline-origins.png"), full_page=True)
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=str(tmp_path / "timeline-origins-dark.png"), full_page=True)
        print(f"screenshots: {tmp_path}")
    finally:
        context.close()


# -- a parent call and its child session, linked both ways ------------------------------------


def test_a_call_links_its_child_session_and_the_child_its_parent_call() -> None:
    call = ToolCall("call_p1", "refunds", {"message": "refund order 42"})
    child = LinkedSession("sub-1", "sub-1", "call_p1", view_href("sub-1", "refunds"))
    parent_page = parse(
        render(
            [Message.user("refund 42"), Message.assistant("", [call])],
            links=SessionLinks(children={"call_p1": child}),
        )
    )
    (link,) = parent_page.find_all("a", **{"class": "child-link"})
    assert link.attrs["href"] == "/agents/refunds/sessions/sub-1/view"
    assert link.attrs["data-child-session"] == "sub-1"
    assert link.parent is not None
    assert link.parent.parent is not None
    assert link.parent.parent.attrs["id"] == "call-call_p1"
    record = ParentCall("a" * 64, "call_p1")
    asked = Message("user", "refund order 42", tool_call_id=record.key, origin="agent-tool")
    parent = LinkedSession("a" * 64, "support-1", "call_p1", view_href("support-1"))
    child_page = parse(
        render([asked, Message.assistant("done")], name="sub-1", links=SessionLinks(parent))
    )
    links = child_page.find_all("a", **{"class": "parent-link"})
    assert [a.attrs["href"] for a in links] == ["/sessions/support-1/view#call-call_p1"] * 2
    assert {a.attrs["data-parent-call"] for a in links} == {"call_p1"}
    (asked_by,) = article(child_page, 0).find_all("p", **{"class": "asked-by"})
    assert "of session support-1" in asked_by.text()
    assert child_page.find_all(data_origin="agent-tool")


def test_a_parent_not_stored_here_is_named_not_linked() -> None:
    gone = LinkedSession("p-gone", "p-gone", "c9")
    page = parse(render([Message.assistant("hi")], links=SessionLinks(gone)))
    (named,) = page.find_all("span", **{"class": "parent-link"})
    assert named.attrs["data-parent-session"] == "p-gone"
    assert page.find_all("a", **{"class": "parent-link"}) == []


def test_view_hrefs_of_the_default_agent_and_of_a_served_one() -> None:
    assert view_href("s 1") == "/sessions/s%201/view"
    assert view_href("s1", "refunds") == "/agents/refunds/sessions/s1/view"


@pytest.fixture(scope="module")
def delegated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("delegated") / "delegated.db"
    with ThreadPoolExecutor(1) as thread:  # away from the browser's event loop
        thread.submit(asyncio.run, store_delegated_sessions(db)).result()
    return db


def _linked_page(db: Path, session_id: str, href: Any = view_href) -> str:
    """The session's page with its links, as the CLI and the Worker render it."""
    with ThreadPoolExecutor(1) as thread:  # away from the browser's event loop
        return thread.submit(asyncio.run, _render_linked(db, session_id, href)).result()


async def _render_linked(db: Path, session_id: str, href: Any) -> str:
    async with sqlite_store(db) as store:
        info = await store.get_session(session_id)
        assert info is not None
        entries = await store.load_timeline(session_id)
        links = await find_links(
            store, session_id, (m for _, m in entries), href=href, agents={"refunds": "refunds"}
        )
        return render_timeline(
            name=info.name or info.id, session_id=info.id, agent=info.agent_name,
            entries=entries, session=info, links=links,
        )  # fmt: skip


def test_stored_sessions_link_both_ways(delegated: Path) -> None:
    parent = parse(_linked_page(delegated, PARENT))
    (child_link,) = parent.find_all("a", **{"class": "child-link"})
    assert child_link.attrs["href"] == f"/agents/refunds/sessions/{CHILD}/view"
    child = parse(_linked_page(delegated, CHILD))
    hrefs = {a.attrs["href"] for a in child.find_all("a", **{"class": "parent-link"})}
    assert hrefs == {f"/sessions/{PARENT}/view#call-{CALL}"}
    # The child's own call (of refund, no agent tool) links to no session.
    assert child.find_all("a", **{"class": "child-link"}) == []


def test_linked_pages_in_chromium_without_javascript(
    browser: Browser, delegated: Path, tmp_path: Path
) -> None:
    def beside(name: str, agent: str | None) -> str:
        return f"{name}.html"

    for session in (PARENT, CHILD):
        page_html = _linked_page(delegated, session, beside)
        (tmp_path / f"{session}.html").write_text(page_html, encoding="utf-8")
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1000, "height": 800}
    )
    try:
        page = context.new_page()
        page.goto((tmp_path / f"{PARENT}.html").as_uri())
        to_child = page.locator("a.child-link")
        assert to_child.is_visible()
        assert to_child.inner_text() == f"child session {CHILD} →"
        page.screenshot(path=str(tmp_path / "timeline-parent.png"), full_page=True)
        to_child.click()
        page.wait_for_url(f"**/{CHILD}.html")
        assert page.locator("h1").inner_text() == CHILD
        to_parent = page.locator("dl.facts a.parent-link")
        assert to_parent.is_visible()
        page.screenshot(path=str(tmp_path / "timeline-child.png"), full_page=True)
        to_parent.click()
        page.wait_for_url(f"**/{PARENT}.html#call-{CALL}")
        assert page.locator("h1").inner_text() == PARENT
        assert page.locator(f"#call-{CALL}").is_visible()
        print(f"screenshots: {tmp_path}")
    finally:
        context.close()
