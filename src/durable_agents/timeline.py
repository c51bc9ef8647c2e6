"""A session's timeline as one HTML page a person reads (`render_timeline`): the
Worker's `GET /sessions/{name}/view` serves it a page at a time (`TimelinePage`), the
CLI's `durable-agents sessions show NAME --html OUT` writes it whole. What the page
shows a person, and why: docs/operating.md ("The timeline page").

One self-contained document, no JavaScript and nothing external (a
Content-Security-Policy forbids any script or fetch): timeline.html beside this
module is its skeleton, timeline.css its style sheet, inlined; this module fills in
the turns, every stored text escaped. Pure Python, standard library only.

Stable hooks (tests/test_timeline.py asserts on them): each message is an
`<article id="m<position>">` with `data-position`, `data-role`, `data-kind` and, when
no client's request wrote it, `data-origin` (`Message.origin`; its turn's section
has `data-origins`); each call a `.call` with `data-call-id`, `data-tool`,
`data-kind` and `data-edited` when a person edited its arguments, and `id="call-<id>"`;
a call whose agent tool ran a child session has an `a.child-link` to it with
`data-child-session`, and a session an agent tool started has an `a.parent-link`
(in its header's facts and on the user message) to the call, with
`data-parent-session` and `data-parent-call` (`durable_agents.session_links`);
`.attention` lists
what a person must not miss, each item's `data-kind` a `ToolErrorKind` or one of
pending-approval, approved-not-run, no-result, stopped; a paged view has a
`<nav class="pages">` above and below with `data-total`, `data-first`, `data-last`.
A call whose result is stored after its page links to it on the next page; a result
whose call is on an earlier page says so.
"""

from __future__ import annotations

import functools
import html
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ._resources import read_text
from .approvals import ApprovalState, approval_states
from .messages import MalformedToolCall, Message, ToolCall, ToolErrorKind, Usage, tool_error
from .schedules import fired_by
from .session_links import LinkedSession, SessionLinks
from .stores.base import ApprovalEvent, SessionInfo

__all__ = ["TimelinePage", "render_timeline"]

_PACKAGE = "durable_agents"  # timeline.html and timeline.css sit beside this module
DIGEST_PREFIX = 12  # hex digits of an approval digest shown
FOLD_CHARS = 1500  # longer texts are folded in a <details> (open, so they print)
_SHOWN_ERROR_KEYS = frozenset({"error", "kind", "toolName", "toolCallId", "reason"})


@dataclass(frozen=True, slots=True)
class TimelinePage:
    """Where one page of a longer session sits (`GET .../view` shows one at a time).

    `first` is the position of the page's first entry. `links` are the hrefs of
    the pages around it by name, `"first"`, `"older"`, `"newer"`, `"latest"` (one
    left out is not linked). `following` holds the (position, message) pairs
    stored right after the page, not shown: where the results of its last calls are.
    """

    first: int
    links: Mapping[str, str] = field(default_factory=dict)
    following: Sequence[tuple[int, Message]] = ()


def render_timeline(
    *,
    name: str,
    session_id: str,
    agent: str | None,
    entries: Sequence[tuple[int, Message]],
    approvals: Sequence[ApprovalEvent] = (),
    page: TimelinePage | None = None,
    session: SessionInfo | None = None,
    links: SessionLinks | None = None,
) -> str:
    """The session's page: `entries` are its stored messages with their
    `created_at` (Unix ms), in order (`store.load_timeline`); `approvals` its
    approval events (`store.load_approvals`; those of calls elsewhere are
    ignored). Without `page`, `entries` are the whole session from position 0;
    with it, one page of it. `session` (`store.get_session`) gives the header
    the session's own times, message count and usage (else: the entries'). `links`
    (`session_links.find_links`) are the child sessions its agent-tool calls ran and
    the parent call that ran its turn."""
    return _Page(
        name, session_id, agent, list(entries), approval_states(approvals), page, session,
        links or SessionLinks(),
    ).render()  # fmt: skip


# -- what each stored thing means -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Flag:
    """How a result or a call stands out: its kind, a short label, a one-line why."""

    kind: str
    label: str
    why: str
    tone: str  # css class: crash | denied | error | pending | orphan | stopped


_KIND_LABELS: dict[str, tuple[str, str]] = {
    ToolErrorKind.UNKNOWN_TOOL: (
        "Unknown tool",
        "the model named a tool this agent does not have; nothing ran",
    ),
    ToolErrorKind.INVALID_ARGUMENTS: (
        "Invalid arguments",
        "its arguments broke the tool's input schema (or were not a JSON object); "
        "the handler was not called",
    ),
    ToolErrorKind.TOOL_FAILED: ("Tool failed", "the handler raised an error"),
    ToolErrorKind.TOOL_TIMEOUT: (
        "Timed out",
        "the handler ran past its timeout and was stopped (the tool is safe_to_retry)",
    ),
    ToolErrorKind.INVALID_OUTPUT: (
        "Invalid output",
        "the handler ran, but its value broke its output schema or was not JSON; it was not stored",
    ),
    ToolErrorKind.RESULT_TOO_LARGE: (
        "Result too large",
        "the handler ran, but its result was over the agent's max_result_bytes; it was not stored",
    ),
}


def _result_flag(message: Message, error: dict[str, Any], stopped: bool = False) -> _Flag:
    """The flag of a failed call's result; `stopped`: the kit's stop note follows it
    (`run.stop_turn` answered the call as lost, safe_to_retry or not)."""
    kind = str(error.get("kind") or "tool-error")
    tool = str(error.get("toolName") or message.tool_name or "the tool")
    text = str(error.get("error") or "")
    if kind == ToolErrorKind.TOOL_DURABILITY_ERROR and stopped:
        return _Flag(
            kind,
            "Lost, turn stopped",
            "requested before a crash; no result was stored, and the turn was stopped "
            "(resuming it kept crashing) instead of running it again, so it may or may not "
            "have taken effect",
            "crash",
        )
    if kind == ToolErrorKind.TOOL_DURABILITY_ERROR:
        if "did not finish within" in text or "lost its connection" in text:
            how = "timed out" if "did not finish within" in text else "lost its connection"
            return _Flag(
                kind,
                "Outcome unknown",
                f"{how} before an answer came back, so it may or may not have taken effect; "
                f"it was not run again because {tool} is not safe_to_retry",
                "crash",
            )
        return _Flag(
            kind,
            "Repaired after a crash",
            "requested before a crash; no result was stored, so it was not run again "
            f"because {tool} is not safe_to_retry (it may or may not have taken effect)",
            "crash",
        )
    if kind == ToolErrorKind.TOOL_DENIED:
        reason = error.get("reason")
        why = "a person denied this call; it did not run"
        return _Flag(kind, "Denied", f"{why} (reason: {reason})" if reason else why, "denied")
    label, why = _KIND_LABELS.get(kind, ("Tool error", "the call's result is an error"))
    return _Flag(kind, label, why, "error")


# Who started a message's turn when no client did (`Message.origin`): its badge and why.
_ORIGINS: dict[str, str] = {
    "scheduled": "a schedule ran this turn at its time (nobody sent its message then)",
    "self-resumed": "stored by a resume nobody asked for (the session's alarm or the worker)",
    "stopped": "the kit's note ending a turn whose resumes kept crashing",
    "agent-tool": "another session's agent tool ran this turn (see the parent call)",
}


def _stop_flag() -> _Flag:
    return _Flag(
        "stopped",
        "Turn stopped",
        "resuming this turn kept crashing, so it was ended here and nothing more of it "
        "ran; the next message starts a new turn",
        "stopped",
    )


def _origin_badge(origin: str) -> str:
    why = _ORIGINS.get(origin, "")
    return (
        f'<span class="badge origin origin-{_e(origin)}" data-origin="{_e(origin)}" '
        f'title="{_e(why)}">{_e(origin)}</span>'
    )


# -- the page -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    number: int | None  # None: not known (the page starts after position 0)
    start: int  # the position of its first message on the page
    continued: bool = False  # it began on an earlier page
    entries: list[tuple[int, int, Message]] = field(default_factory=list)  # (pos, ms, msg)

    @property
    def anchor(self) -> str:
        return f"turn-{self.number}" if self.number is not None else f"turn-at-{self.start}"

    @property
    def heading(self) -> str:
        if self.continued:
            return "Continued from the page before"
        if self.number is None:
            return f"Turn from #{self.start:,}"
        return f"Turn {self.number}" if self.number else "Before the first user message"

    @property
    def usage(self) -> Usage:
        return sum((m.usage for _, _, m in self.entries if m.usage), Usage())


def _result_positions(messages: Mapping[int, Message]) -> dict[str, int]:
    """Call id -> the position of its (first) stored result."""
    results: dict[str, int] = {}
    for position, message in sorted(messages.items(), key=lambda pm: pm[0]):
        if message.role == "tool" and message.tool_call_id is not None:
            results.setdefault(message.tool_call_id, position)
    return results


def _call_positions(entries: Sequence[tuple[int, int, Message]]) -> dict[str, int]:
    """Call id -> the position of the message asking for it."""
    calls: dict[str, int] = {}
    for position, _, message in entries:
        for call in message.tool_calls:
            calls.setdefault(call.id, position)
    return calls


def _turns(entries: Sequence[tuple[int, int, Message]], first: int) -> list[_Turn]:
    """The entries of a page starting at position `first`, by turn: a user message
    starts one; what comes before the first is turn 0 on the session's first page,
    else the rest of a turn begun on an earlier page."""
    turns: list[_Turn] = []
    for position, ms, message in entries:
        if message.role == "user":
            number = sum(1 for t in turns if t.number) + 1 if first == 0 else None
            turns.append(_Turn(number, position))
        elif not turns:
            continued = first > 0
            turns.append(_Turn(None if continued else 0, position, continued))
        turns[-1].entries.append((position, ms, message))
    return turns


def _stopped_results(messages: Mapping[int, Message]) -> set[int]:
    """The positions of the results right before a stop note: the calls `stop_turn`
    answered as lost."""
    stopped: set[int] = set()
    for position, message in messages.items():
        if message.origin == "stopped" and message.role == "assistant":
            before = position - 1
            while before in messages and messages[before].role == "tool":
                stopped.add(before)
                before -= 1
    return stopped


class _Page:
    """One page of a session's timeline: what its messages mean to each other (which
    result answers which call, the turns, what needs attention), then its HTML."""

    def __init__(
        self,
        name: str,
        session_id: str,
        agent: str | None,
        entries: list[tuple[int, Message]],
        states: dict[str, ApprovalState],
        page: TimelinePage | None = None,
        session: SessionInfo | None = None,
        links: SessionLinks | None = None,
    ) -> None:
        self.name, self.session_id, self.agent = name, session_id, agent
        self.links_to = links or SessionLinks()
        self.paged = page is not None
        if page is None:
            page = TimelinePage(first=0)
        self.first, self.links = page.first, page.links
        self.session = session
        # (position, created_at, message) of each message shown
        self.entries = [(self.first + i, ms, m) for i, (ms, m) in enumerate(entries)]
        end = self.first + len(self.entries)
        self.total = max(session.message_count, end) if session is not None else end
        self.later = bool(page.following) or end < self.total  # messages after this page
        self.whole = self.first == 0 and not self.later  # the page is the whole session
        # the page's messages and those stored right after it, by position
        self.messages = {p: m for p, _, m in self.entries} | dict(page.following)
        self.results = _result_positions(self.messages)
        self.calls = _call_positions(self.entries)
        self.states = {k: s for k, s in states.items() if k in self.calls}  # the page's calls
        self.turns = _turns(self.entries, self.first)
        self.stopped = _stopped_results(self.messages)
        self.attention = self._needs_attention()

    # -- what the messages mean -----------------------------------------------------------

    def _needs_attention(self) -> list[tuple[int, _Flag, str]]:
        """What stands out, in page order: (position, flag, tool name)."""
        attention: list[tuple[int, _Flag, str]] = []
        for position, _, message in self.entries:
            if message.role == "tool":
                flag = self._result_flag_at(position, message)
                if flag is not None and flag.tone in ("crash", "denied"):
                    attention.append((position, flag, message.tool_name or ""))
            elif message.origin == "stopped":
                attention.append((position, _stop_flag(), ""))
            for call in message.tool_calls:
                unanswered = self._unanswered(call)
                if unanswered is not None:
                    attention.append((position, unanswered, call.name))
        return attention

    def _result_flag_at(self, position: int, message: Message) -> _Flag | None:
        """The flag of the tool result at `position` (None: not an error)."""
        error = tool_error(message.content)
        if error is None:
            return None
        return _result_flag(message, error, position in self.stopped)

    def _unanswered(self, call: ToolCall) -> _Flag | None:
        """The flag of a call without a stored result (None if it has one, or may
        have one after this page)."""
        if call.id in self.results or self.later:
            return None
        state = self.states.get(call.id)
        if state is not None and state.decision is None:
            return _Flag(
                "pending-approval",
                "Awaiting approval",
                f"{call.name} needs a person's decision before it runs; digest "
                f"{state.digest[:DIGEST_PREFIX]}…",
                "pending",
            )
        if state is not None and state.decision == "approved" and not state.claimed:
            return _Flag(
                "approved-not-run",
                "Approved, not run yet",
                f"a person approved {call.name}; the next run executes it once",
                "pending",
            )
        return _Flag(
            "no-result",
            "No result stored",
            "the run stopped after this call was stored and before its result was; "
            "the next run answers it",
            "orphan",
        )

    # -- the page around the turns --------------------------------------------------------

    def render(self) -> str:
        turns = "".join(self._turn(t) for t in self.turns)
        return _page_template().substitute(
            title=_e(self._title()),
            css=_page_css(),
            name=_e(self.name),
            facts="".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in self._facts()),
            nav_top=self._nav("top"),
            attention=self._attention(),
            turns=turns or f'<p class="empty">{_e(self._empty())}</p>',
            nav_bottom=self._nav("bottom"),
        )

    def _title(self) -> str:
        title = f"{self.name} · durable-agents session"
        if not self.whole and self.entries:
            title += f" · #{self.entries[0][0]:,} to #{self.entries[-1][0]:,}"
        return title

    def _empty(self) -> str:
        """What the page says when it shows no message."""
        if self.total:
            return f"No messages here: the session holds #0 to #{self.total - 1:,}."
        return "This session has no stored messages."

    def _facts(self) -> list[tuple[str, str]]:
        """The header's (name, html) pairs: the session's own times and usage when
        its row is known, else the entries'."""
        session = self.session
        if session is not None:
            total = Usage(session.input_tokens, session.output_tokens)
            created: int | None = session.created_at
            updated: int | None = session.updated_at
        else:
            total = sum((m.usage for _, _, m in self.entries if m.usage), Usage())
            times = [ms for _, ms, _ in self.entries]
            created, updated = (times[0], times[-1]) if times else (None, None)
        facts = [
            ("Session id", f"<code>{_e(self.session_id)}</code>"),
            ("Agent", _e(self.agent or "—")),
        ]
        parent = self.links_to.parent
        if parent is not None:
            facts.append(("Called by", _parent_link(parent)))
        facts += [
            ("Created", _time(created) if created is not None else "—"),
            ("Updated", _time(updated) if updated is not None else "—"),
            ("Messages", f"{self.total:,}"),
        ]
        if self.whole:
            facts.append(("Turns", f"{sum(1 for t in self.turns if t.number):,}"))
        facts.append(("Usage", _usage(total)))
        return facts

    def _nav(self, where: str) -> str:
        """The links to the pages around this one, and which messages it shows."""
        if not self.paged:
            return ""
        if self.entries:
            first, last = self.entries[0][0], self.entries[-1][0]
            what = f"Messages #{first:,} to #{last:,} of {self.total:,}"
            span = f' data-first="{first}" data-last="{last}"'
        else:
            what, span = "No messages on this page", ""
        parts = []
        for key, label in (("first", "« First"), ("older", "← Older"), ("range", what),
                           ("newer", "Newer →"), ("latest", "Latest »")):  # fmt: skip
            href = self.links.get(key)
            rel = {"older": ' rel="prev"', "newer": ' rel="next"'}.get(key, "")
            if key == "range":
                parts.append(f'<span class="range">{_e(label)}</span>')
            elif href is None:
                parts.append(f'<span class="{key} off">{_e(label)}</span>')
            else:
                parts.append(f'<a class="{key}"{rel} href="{_e(href)}">{_e(label)}</a>')
        return (
            f'<nav class="pages pages-{where}" aria-label="Pages of the session" '
            f'data-total="{self.total}"{span}>{"".join(parts)}</nav>'
        )

    def _attention(self) -> str:
        where = "" if self.whole else " on this page"
        if not self.attention:
            return (
                f'<p class="allclear" data-kind="all-clear">Nothing{where} needs attention: '
                "no repaired, denied, waiting or unanswered call.</p>"
            )
        items = "".join(
            f'<li class="tone-{f.tone}" data-kind="{_e(f.kind)}">'
            f'<a href="#m{p}"><span class="badge">{_e(f.label)}</span> '
            f"{f'<code>{_e(tool)}</code> ' if tool else ''}at message {p}</a></li>"
            for p, f, tool in self.attention
        )
        return (
            '<section class="attention" aria-labelledby="attention-title">'
            f'<h2 id="attention-title">Needs attention{where} ({len(self.attention)})</h2>'
            f"<ul>{items}</ul></section>"
        )

    # -- turns and messages ---------------------------------------------------------------

    def _turn(self, turn: _Turn) -> str:
        first, last = turn.entries[0][1], turn.entries[-1][1]
        first_pos, last_pos = turn.entries[0][0], turn.entries[-1][0]
        tones = [f.tone for p, f, _ in self.attention if first_pos <= p <= last_pos]
        tone = "crash" if "crash" in tones else tones[0] if tones else ""
        marks = f' <span class="badge tone-{tone}">{len(tones)} to check</span>' if tones else ""
        origins = [o for o in _ORIGINS if any(m.origin == o for _, _, m in turn.entries)]
        marks += "".join(f" {_origin_badge(o)}" for o in origins)
        marked = f' data-origins="{" ".join(origins)}"' if origins else ""
        meta = (
            f"{_time(first)} · {_duration(last - first)} · {len(turn.entries)} messages · "
            f"{_usage(turn.usage)}"
        )
        articles = "".join(self._message(p, ms, m) for p, ms, m in turn.entries)
        number = f' data-turn="{turn.number}"' if turn.number is not None else ""
        return (
            f'<section class="turn" id="{turn.anchor}"{number} data-start="{turn.start}"{marked}>'
            f'<h2><a href="#{turn.anchor}">{_e(turn.heading)}</a>{marks}</h2>'
            f'<p class="meta">{meta}</p>{articles}</section>\n'
        )

    def _message(self, position: int, ms: int, message: Message) -> str:
        kind, who, inner, tone = self._content(position, message)
        usage = f' · <span class="usage">{_usage(message.usage)}</span>' if message.usage else ""
        klass = f"msg role-{message.role}" + (f" tone-{tone}" if tone else "")
        origin, badge = "", ""
        if message.origin is not None:
            klass += f" origin-{_e(message.origin)}"
            origin = f' data-origin="{_e(message.origin)}"'
            badge = f" {_origin_badge(message.origin)}"
            by = fired_by(message.request_key) if message.origin == "scheduled" else None
            if by is not None:  # which schedule (a recurring one: which occurrence)
                badge += f' <span class="scheduled-by">from {_e(by)}</span>'
        return (
            f'<article id="m{position}" class="{klass}" data-position="{position}" '
            f'data-role="{_e(message.role)}" data-kind="{_e(kind)}"{origin}>'
            f'<header><a class="pos" href="#m{position}">#{position}</a> '
            f'<span class="who">{who}</span>{badge} · {_time(ms)}{usage}</header>{inner}</article>'
        )

    def _content(self, position: int, message: Message) -> tuple[str, str, str, str]:
        """(data-kind, who, inner html, tone) of a message, by what it is."""
        if message.summary_of is not None:
            who = f"Summary of messages 0 to {message.summary_of - 1}"
            return "summary", who, _text(message.content) + _instructions(message), ""
        if message.role in ("user", "system"):
            inner = _text(message.content) + _instructions(message)
            parent = self.links_to.parent
            if message.parent_call is not None and parent is not None:
                inner = f'<p class="asked-by">Asked by {_parent_link(parent)}</p>' + inner
            return message.role, message.role.capitalize(), inner, ""
        if message.role == "assistant":
            return self._assistant_content(message)
        return self._result_content(position, message)

    def _assistant_content(self, message: Message) -> tuple[str, str, str, str]:
        text = _text(message.content) if message.content else ""
        if not message.tool_calls and message.origin == "stopped":
            flag = _stop_flag()
            return flag.kind, "Stopped by durable-agents", _banner(flag) + text, flag.tone
        if not message.tool_calls:
            return "reply", "Assistant", text or '<p class="none">(no text)</p>', ""
        calls = "".join(self._call(c) for c in message.tool_calls)
        n = len(message.tool_calls)
        who = f"Assistant · asks for {n} tool call{'s' if n != 1 else ''}"
        return "tool-calls", who, text + calls, self._calls_tone(message.tool_calls)

    def _calls_tone(self, calls: Sequence[ToolCall]) -> str:
        """The tone of a message asking for `calls`: "pending" if one waits for a
        person, "orphan" if one has no result, else none."""
        flags = [f for f in map(self._unanswered, calls) if f is not None]
        if not flags:
            return ""
        return "pending" if any(f.tone == "pending" for f in flags) else "orphan"

    def _result_content(self, position: int, message: Message) -> tuple[str, str, str, str]:
        who = f"Result of <code>{_e(message.tool_name or '?')}</code>{self._answers(message)}"
        error = tool_error(message.content)
        if error is None:
            return "tool-result", who, _code(_pretty(message.content)), ""
        flag = _result_flag(message, error, position in self.stopped)
        stored = str(error.get("error") or "")
        # The call's name, id and a denial's reason are shown already; anything else stored:
        extra = {k: v for k, v in error.items() if k not in _SHOWN_ERROR_KEYS}
        details = f'<p class="stored"><span class="k">Stored error:</span> {_e(stored)}</p>' + (
            _code(json.dumps(extra, ensure_ascii=False, indent=2)) if extra else ""
        )
        return flag.kind, who, _banner(flag) + details, flag.tone

    def _answers(self, result: Message) -> str:
        """Where the call a result answers is: a link to it on this page, or the note
        that it is on an earlier one."""
        asked = self.calls.get(result.tool_call_id or "")
        if asked is not None:
            return f' · answers <a href="#m{asked}">#{asked}</a>'
        if self.first > 0:  # its call may be on an earlier page
            older = self.links.get("older")
            earlier = f'<a href="{_e(older)}">an earlier page</a>' if older else "an earlier page"
            return f" · answers a call on {earlier}"
        return ""

    # -- tool calls -----------------------------------------------------------------------

    def _call(self, call: ToolCall) -> str:
        flag = self._unanswered(call)
        args = _arguments(call)
        state = self.states.get(call.id)
        edited = ""
        if state is not None and state.decision == "approved" and state.arguments is not None:
            args = _edited(args, state)
            edited = ' data-edited="true"'
        status = _banner(flag) if flag else ""
        kind = flag.kind if flag else "call"
        return (
            f'<div class="call{" tone-" + flag.tone if flag else ""}" data-kind="{_e(kind)}" '
            f'id="call-{_e(call.id)}" data-call-id="{_e(call.id)}" data-tool="{_e(call.name)}"'
            f'{edited}><p class="callhead"><span class="k">Calls</span> '
            f'<code class="tool">{_e(call.name)}</code>'
            f' <span class="callid">id {_e(call.id)}</span> {_decision(state)} '
            f"{self._outcome(call, flag)}{self._child(call)}</p>{status}{args}</div>"
        )

    def _outcome(self, call: ToolCall, flag: _Flag | None) -> str:
        """The link to a call's result (with whether it failed), here or on the next page."""
        result = self.results.get(call.id)
        newer = self.links.get("newer")
        if result is not None:
            here = result <= self.entries[-1][0]
            href = f"#m{result}" if here else f"{newer or ''}#m{result}"
            where = "" if here else " (next page)"
            outcome = f'<a class="result-link" href="{_e(href)}">result: #{result}{where}</a>'
            return outcome + self._result_summary(result)
        if flag is None and newer is not None:  # stored after the page
            return f'<a class="result-link" href="{_e(newer)}">result: on a later page</a>'
        return ""

    def _child(self, call: ToolCall) -> str:
        """The link to the child session the call's agent tool ran, if one is stored."""
        child = self.links_to.children.get(call.id)
        if child is None or child.href is None:
            return ""
        return (
            f' <a class="child-link" href="{_e(child.href)}" '
            f'data-child-session="{_e(child.name)}">child session {_e(child.name)} →</a>'
        )

    def _result_summary(self, position: int) -> str:
        flag = self._result_flag_at(position, self.messages[position])
        if flag is None:
            return ' <span class="badge tone-ok">ok</span>'
        return f' <span class="badge tone-{flag.tone}">{_e(flag.label)}</span>'


def _arguments(call: ToolCall) -> str:
    """A call's arguments as the model sent them (or the text it could not parse)."""
    if isinstance(call, MalformedToolCall):
        return (
            f'<p class="stored"><span class="k">Malformed arguments:</span> '
            f"{_e(call.arguments_error)}</p>{_code(call.raw_arguments)}"
        )
    return _code(json.dumps(call.arguments, ensure_ascii=False, indent=2))


def _parent_link(parent: LinkedSession) -> str:
    """The call of the parent session that ran this session's turn: a link to it on the
    parent's page (its text alone when the parent is not stored where this page was read)."""
    text = f"call <code>{_e(parent.call_id)}</code> of session {_e(parent.name)}"
    marks = f'data-parent-session="{_e(parent.name)}" data-parent-call="{_e(parent.call_id)}"'
    if parent.href is None:
        return f'<span class="parent-link" {marks}>{text}</span>'
    href = f"{parent.href}#call-{parent.call_id}"
    return f'<a class="parent-link" href="{_e(href)}" {marks}>← {text}</a>'


def _decision(state: ApprovalState | None) -> str:
    """The badges of a person's decision on a call: approved or denied, edited, claimed."""
    if state is None or state.decision is None:
        return ""
    badges = f'<span class="badge tone-quiet">{_e(state.decision)} by a person</span>'
    if state.decision == "approved" and state.arguments is not None:
        badges += ' <span class="badge tone-edited">arguments edited</span>'
    if state.claimed:
        badges += ' <span class="badge tone-quiet">claimed</span>'
    return badges


# -- the page's files -----------------------------------------------------------------------


@functools.cache
def _page_template() -> string.Template:
    """timeline.html: the document around the turns, with `$name` slots for its parts."""
    return string.Template(read_text(_PACKAGE, "timeline.html"))


@functools.cache
def _page_css() -> str:
    """timeline.css, inlined in the page's `<style>`."""
    return read_text(_PACKAGE, "timeline.css")


# -- small helpers --------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _banner(flag: _Flag) -> str:
    return (
        f'<p class="flag tone-{flag.tone}" role="note"><strong class="label">'
        f'{_e(flag.label)}</strong> <span class="why">{_e(flag.why)}</span></p>'
    )


def _edited(model_args: str, state: ApprovalState) -> str:
    """A call's arguments as the model asked, then the approver's edit it runs with."""
    edit = json.dumps(state.arguments, ensure_ascii=False, indent=2)
    digest = (state.arguments_digest or "")[:DIGEST_PREFIX]
    return (
        f'<div class="asked"><p class="stored"><span class="k">The model asked for:</span></p>'
        f'{model_args}</div><div class="edit"><p class="stored"><span class="k">Edited by the '
        f'approver; it runs with:</span> <span class="callid">digest {_e(digest)}…</span></p>'
        f"{_code(edit)}</div>"
    )


def _instructions(message: Message) -> str:
    """The instructions a turn was sent, stored on its user message (or a summary):
    collapsed, one line until opened."""
    if message.instructions is None:
        return ""
    size = len(message.instructions)
    return (
        f'<details class="instructions" data-chars="{size}"><summary>Instructions the turn '
        f"was sent ({size:,} characters)</summary><pre>{_e(message.instructions)}</pre></details>"
    )


def _text(text: str) -> str:
    body = f'<div class="text">{_e(text)}</div>'
    return _fold(body, len(text), "text")


def _code(text: str) -> str:
    return _fold(f"<pre>{_e(text)}</pre>", len(text), "JSON" if text[:1] in "{[" else "text")


def _fold(body: str, size: int, what: str) -> str:
    if size <= FOLD_CHARS:
        return body
    return f"<details open><summary>{size:,} characters of {what}</summary>{body}</details>"


def _pretty(content: str) -> str:
    """A JSON result indented; any other text as it is."""
    try:
        return json.dumps(json.loads(content), ensure_ascii=False, indent=2)
    except (ValueError, RecursionError):
        return content


def _time(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    iso = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return f'<time datetime="{iso}">{moment.strftime("%Y-%m-%d %H:%M:%S")} UTC</time>'


def _duration(ms: int) -> str:
    seconds = max(ms, 0) / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _usage(usage: Usage | None) -> str:
    usage = usage or Usage()
    return (
        f'<span class="tokens" data-input-tokens="{usage.input_tokens}" '
        f'data-output-tokens="{usage.output_tokens}">{usage.input_tokens:,} in · '
        f"{usage.output_tokens:,} out tokens</span>"
    )
