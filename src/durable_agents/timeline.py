"""A session's timeline as one HTML page a person reads (`render_timeline`).

One self-contained document: inline CSS, no JavaScript, no external asset (a
Content-Security-Policy forbids any script or fetch), every stored text escaped.
Turns in order (a turn starts at a user message); each message is an
`<article id="m<position>">` carrying `data-position`, `data-role` and
`data-kind`; each tool call shows its arguments and, linked, its result. What a
person must not miss stands out with a colour, a label and a one-line why:

    tool-durability-error   a call repaired after a crash (or timed out / cut off):
                            its outcome is unknown and it was not run again
    tool-denied             a person denied the call; it did not run
    other error kinds       `ToolErrorKind`: unknown tool, invalid arguments, ...
    pending approval        requested, not decided yet (with its digest's prefix)
    no result stored        a call whose run stopped before its result was stored
    turn stopped            the kit's note ending a turn whose resumes kept crashing
                            (`run.stop_turn`, origin "stopped")

A call a person approved with edited arguments shows both: what the model asked
for and, below it, the approver's edit it runs with (`data-edited` on the call,
the edit's digest prefix). A turn's user message (or a summary) that carries the
instructions the turn was sent (`Message.instructions`, for an agent whose
instructions are a function) has them in a collapsed "Instructions" line.

A message that no client's request wrote is marked with its `Message.origin`: a
badge beside who wrote it ("scheduled": a schedule's turn, "self-resumed": a
resume nobody asked for, "stopped": the stop note), and its turn's heading
carries the same badges (`data-origin` on the article, `data-origins` on the turn).

Usage per turn and in total, UTC times. Pure Python, standard library only: the
Worker serves it (`GET /sessions/{name}/view`) and the CLI writes it
(`durable-agents sessions show NAME --html out.html`).

A long session is shown a page at a time (`TimelinePage`): the page's entries
keep their positions (`#m<position>`), a `<nav class="pages">` above and below
links the first, older, newer and latest pages and says which messages these
are, and the box of what needs attention covers the page. A call whose result
is stored after the page links to it on the next page; a result whose call is
on an earlier page says so.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .approvals import ApprovalState, approval_states
from .messages import MalformedToolCall, Message, ToolCall, ToolErrorKind, Usage, tool_error
from .stores.base import ApprovalEvent, SessionInfo

__all__ = ["TimelinePage", "render_timeline"]

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
) -> str:
    """The session's page: `entries` are its stored messages with their
    `created_at` (Unix ms), in order (`store.load_timeline`); `approvals` its
    approval events (`store.load_approvals`; those of calls elsewhere are
    ignored). Without `page`, `entries` are the whole session from position 0;
    with it, one page of it. `session` (`store.get_session`) gives the header
    the session's own times, message count and usage (else: the entries')."""
    return _Page(
        name, session_id, agent, list(entries), approval_states(approvals), page, session
    ).render()


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


class _Page:
    def __init__(
        self,
        name: str,
        session_id: str,
        agent: str | None,
        entries: list[tuple[int, Message]],
        states: dict[str, ApprovalState],
        page: TimelinePage | None = None,
        session: SessionInfo | None = None,
    ) -> None:
        self.name, self.session_id, self.agent = name, session_id, agent
        self.first = page.first if page is not None else 0
        self.links: Mapping[str, str] = page.links if page is not None else {}
        self.paged = page is not None
        self.session = session
        # (position, created_at, message) of each message shown
        self.entries = [(self.first + i, ms, m) for i, (ms, m) in enumerate(entries)]
        end = self.first + len(self.entries)
        self.total = max(session.message_count, end) if session is not None else end
        following = list(page.following) if page is not None else []
        self.later = bool(following) or end < self.total  # messages after this page
        self.whole = self.first == 0 and not self.later  # the page is the whole session
        self.messages = {p: m for p, _, m in self.entries} | dict(following)
        self.results: dict[str, int] = {}  # call id -> position of its (first) result
        self.calls: dict[str, int] = {}  # call id -> position of the message asking it
        for position, message in sorted(self.messages.items(), key=lambda pm: pm[0]):
            if message.role == "tool" and message.tool_call_id is not None:
                self.results.setdefault(message.tool_call_id, position)
        for position, _, message in self.entries:
            for call in message.tool_calls:
                self.calls.setdefault(call.id, position)
        self.states = {k: s for k, s in states.items() if k in self.calls}  # the page's calls
        self.turns: list[_Turn] = []
        for position, ms, message in self.entries:
            if message.role == "user":
                known = self.first == 0
                number = sum(1 for t in self.turns if t.number) + 1 if known else None
                self.turns.append(_Turn(number, position))
            elif not self.turns:  # what came before the page's first user message
                continued = self.first > 0
                self.turns.append(_Turn(None if continued else 0, position, continued))
            self.turns[-1].entries.append((position, ms, message))
        # The results right before a stop note: what `stop_turn` answered as lost.
        self.stopped: set[int] = set()
        for position, message in self.messages.items():
            if message.origin == "stopped" and message.role == "assistant":
                before = position - 1
                while before in self.messages and self.messages[before].role == "tool":
                    self.stopped.add(before)
                    before -= 1
        # What stands out, in page order: (position, flag, tool name)
        self.attention: list[tuple[int, _Flag, str]] = []
        for position, _, message in self.entries:
            if message.role == "tool":
                error = tool_error(message.content)
                if error is not None:
                    flag = _result_flag(message, error, position in self.stopped)
                    if flag.tone in ("crash", "denied"):
                        self.attention.append((position, flag, message.tool_name or ""))
            elif message.origin == "stopped":
                self.attention.append((position, _stop_flag(), ""))
            for call in message.tool_calls:
                unanswered = self._unanswered(call)
                if unanswered is not None:
                    self.attention.append((position, unanswered, call.name))

    # -- pieces ---------------------------------------------------------------------------

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

    def render(self) -> str:
        session = self.session
        if session is not None:
            total = Usage(session.input_tokens, session.output_tokens)
            created: int | None = session.created_at
            updated: int | None = session.updated_at
        else:
            total = sum((m.usage for _, _, m in self.entries if m.usage), Usage())
            times = [ms for _, ms, _ in self.entries]
            created, updated = (times[0], times[-1]) if times else (None, None)
        title = f"{self.name} · durable-agents session"
        if not self.whole and self.entries:
            title += f" · #{self.entries[0][0]:,} to #{self.entries[-1][0]:,}"
        facts = [
            ("Session id", f"<code>{_e(self.session_id)}</code>"),
            ("Agent", _e(self.agent or "—")),
            ("Created", _time(created) if created is not None else "—"),
            ("Updated", _time(updated) if updated is not None else "—"),
            ("Messages", f"{self.total:,}"),
        ]
        if self.whole:
            facts.append(("Turns", f"{sum(1 for t in self.turns if t.number):,}"))
        facts.append(("Usage", _usage(total)))
        head = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts)
        empty = "This session has no stored messages."
        if self.total:
            empty = f"No messages here: the session holds #0 to #{self.total - 1:,}."
        body = "".join(self._turn(t) for t in self.turns) or f'<p class="empty">{_e(empty)}</p>'

        return (
            "<!doctype html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; img-src data:\">"
            '<meta name="referrer" content="no-referrer">'
            '<link rel="icon" href="data:,">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n"
            f"<body><main>\n<header>"
            f'<p class="kicker">durable-agents · session timeline</p>'
            f'<h1>{_e(self.name)}</h1><dl class="facts">{head}</dl>'
            f"{self._nav('top')}{self._attention()}</header>\n{body}\n{self._nav('bottom')}"
            "<footer><p>Times are UTC. A turn starts at a user message. "
            "This page needs no JavaScript.</p></footer>\n"
            "</main></body></html>\n"
        )

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
        return (
            f'<article id="m{position}" class="{klass}" data-position="{position}" '
            f'data-role="{_e(message.role)}" data-kind="{_e(kind)}"{origin}>'
            f'<header><a class="pos" href="#m{position}">#{position}</a> '
            f'<span class="who">{who}</span>{badge} · {_time(ms)}{usage}</header>{inner}</article>'
        )

    def _content(self, position: int, message: Message) -> tuple[str, str, str, str]:
        """(data-kind, who, inner html, tone)"""
        if message.summary_of is not None:
            who = f"Summary of messages 0 to {message.summary_of - 1}"
            return "summary", who, _text(message.content) + _instructions(message), ""
        if message.role in ("user", "system"):
            inner = _text(message.content) + _instructions(message)
            return message.role, message.role.capitalize(), inner, ""
        if message.role == "assistant":
            text = _text(message.content) if message.content else ""
            if not message.tool_calls and message.origin == "stopped":
                flag = _stop_flag()
                return flag.kind, "Stopped by durable-agents", _banner(flag) + text, flag.tone
            if not message.tool_calls:
                return "reply", "Assistant", text or '<p class="none">(no text)</p>', ""
            calls = "".join(self._call(c) for c in message.tool_calls)
            tone = ""
            if any(self._unanswered(c) for c in message.tool_calls):
                tone = (
                    "pending"
                    if any(
                        (f := self._unanswered(c)) and f.tone == "pending"
                        for c in message.tool_calls
                    )
                    else "orphan"
                )
            n = len(message.tool_calls)
            who = f"Assistant · asks for {n} tool call{'s' if n != 1 else ''}"
            return "tool-calls", who, text + calls, tone
        # a tool result
        tool = _e(message.tool_name or "?")
        asked = self.calls.get(message.tool_call_id or "")
        link = f' · answers <a href="#m{asked}">#{asked}</a>' if asked is not None else ""
        if asked is None and self.first > 0:  # its call may be on an earlier page
            older = self.links.get("older")
            earlier = f'<a href="{_e(older)}">an earlier page</a>' if older else "an earlier page"
            link = f" · answers a call on {earlier}"
        who = f"Result of <code>{tool}</code>{link}"
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

    def _call(self, call: ToolCall) -> str:
        if isinstance(call, MalformedToolCall):
            args = (
                f'<p class="stored"><span class="k">Malformed arguments:</span> '
                f"{_e(call.arguments_error)}</p>{_code(call.raw_arguments)}"
            )
        else:
            args = _code(json.dumps(call.arguments, ensure_ascii=False, indent=2))
        result = self.results.get(call.id)
        flag = self._unanswered(call)
        newer = self.links.get("newer")
        if result is not None:
            here = result <= self.entries[-1][0]
            href = f"#m{result}" if here else f"{newer or ''}#m{result}"
            where = "" if here else " (next page)"
            outcome = f'<a class="result-link" href="{_e(href)}">result: #{result}{where}</a>'
            outcome += self._result_summary(result)
        elif flag is None and newer is not None:  # stored after the page
            outcome = f'<a class="result-link" href="{_e(newer)}">result: on a later page</a>'
        else:
            outcome = ""
        state = self.states.get(call.id)
        approval, edited = "", ""
        if state is not None and state.decision is not None:
            approval = f'<span class="badge tone-quiet">{_e(state.decision)} by a person</span>'
            if state.decision == "approved" and state.arguments is not None:
                approval += ' <span class="badge tone-edited">arguments edited</span>'
                args = _edited(args, state)
                edited = ' data-edited="true"'
            if state.claimed:
                approval += ' <span class="badge tone-quiet">claimed</span>'
        status = _banner(flag) if flag else ""
        kind = flag.kind if flag else "call"
        return (
            f'<div class="call{" tone-" + flag.tone if flag else ""}" data-kind="{_e(kind)}" '
            f'data-call-id="{_e(call.id)}" data-tool="{_e(call.name)}"{edited}>'
            f'<p class="callhead"><span class="k">Calls</span> '
            f'<code class="tool">{_e(call.name)}</code>'
            f' <span class="callid">id {_e(call.id)}</span> {approval} {outcome}</p>'
            f"{status}{args}</div>"
        )

    def _result_summary(self, position: int) -> str:
        message = self.messages[position]
        error = tool_error(message.content)
        if error is None:
            return ' <span class="badge tone-ok">ok</span>'
        flag = _result_flag(message, error, position in self.stopped)
        return f' <span class="badge tone-{flag.tone}">{_e(flag.label)}</span>'


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


_CSS = """
:root{color-scheme:light dark;--bg:#f7f7f5;--card:#fff;--ink:#1d1f23;--muted:#5f6570;
--line:#dcdfe4;--code:#f1f2f4;--user:#2b6cb0;--assistant:#38a169;--tool:#718096;
--crash:#c2410c;--crash-bg:#fff1e6;--denied:#9d174d;--denied-bg:#fdecf3;
--error:#b91c1c;--error-bg:#fdeeee;--pending:#1d4ed8;--pending-bg:#e8efff;
--orphan:#a16207;--orphan-bg:#fef7e0;--ok:#15803d;--scheduled:#6d28d9;
--resumed:#0f766e;--stopped:#334155;--stopped-bg:#e8ecf1;--edited:#0369a1}
@media (prefers-color-scheme:dark){:root{--bg:#15171a;--card:#1e2126;--ink:#e6e8eb;
--muted:#9aa1ac;--line:#33373e;--code:#262a31;--crash:#fb923c;--crash-bg:#3a2113;
--denied:#f472b6;--denied-bg:#3a1628;--error:#f87171;--error-bg:#3a1a1a;
--pending:#93b4ff;--pending-bg:#1b2744;--orphan:#facc15;--orphan-bg:#352d0c;--ok:#4ade80;
--scheduled:#c4b5fd;--resumed:#5eead4;--stopped:#cbd5e1;--stopped-bg:#262d38;
--edited:#7dd3fc}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",sans-serif}
main{max-width:58rem;margin:0 auto;padding:1.5rem 1rem 3rem}
a{color:inherit}
code,pre{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"Liberation Mono",monospace;
font-size:.85em}
pre{background:var(--code);border-radius:6px;padding:.5rem .7rem;margin:.4rem 0 0;
white-space:pre-wrap;overflow-wrap:anywhere}
h1{margin:.1rem 0 .6rem;font-size:1.6rem;overflow-wrap:anywhere}
.kicker{margin:0;color:var(--muted);font-size:.8rem;text-transform:uppercase;letter-spacing:.06em}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(11rem,1fr));gap:.3rem 1rem;
margin:0 0 1rem}
.facts div:first-child{grid-column:1/-1}
.facts dt{color:var(--muted);font-size:.75rem;text-transform:uppercase;letter-spacing:.04em}
.facts dd{margin:0;overflow-wrap:anywhere}
.attention{border:2px solid var(--crash);border-radius:8px;padding:.5rem .9rem;
background:var(--card);margin-bottom:1rem}
.attention h2{font-size:1rem;margin:.2rem 0;color:var(--crash)}
.attention ul{margin:.2rem 0;padding-left:1.1rem}
.attention a{text-decoration:none}
.allclear{color:var(--ok)}
.turn{margin:1.6rem 0}
.turn>h2{font-size:1.15rem;margin:0;border-bottom:1px solid var(--line);padding-bottom:.2rem}
.turn>h2 a{text-decoration:none}
.meta{color:var(--muted);font-size:.85rem;margin:.2rem 0 .6rem}
.msg{background:var(--card);border:1px solid var(--line);border-left:4px solid var(--tool);
border-radius:8px;padding:.55rem .8rem;margin:.5rem 0;break-inside:avoid}
.msg>header{color:var(--muted);font-size:.8rem}
.msg .who{color:var(--ink);font-weight:600}
.pos{text-decoration:none;font-variant-numeric:tabular-nums}
.msg,.turn{scroll-margin-top:1rem}
.msg:target{box-shadow:0 0 0 3px var(--pending)}
.role-user{border-left-color:var(--user)}
.role-assistant{border-left-color:var(--assistant)}
.role-tool{margin-left:1.5rem}
.text{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3rem 0 0}
.none{color:var(--muted);margin:.3rem 0 0}
.call{border-top:1px dashed var(--line);margin-top:.5rem;padding-top:.4rem}
.callhead{margin:0}
.callhead .k,.stored .k{color:var(--muted);font-size:.8rem}
.tool{font-weight:700;font-size:.95em}
.callid{color:var(--muted);font-size:.75rem}
.result-link{font-size:.85rem}
.badge{display:inline-block;border-radius:999px;padding:0 .5rem;font-size:.75rem;
font-weight:700;border:1px solid currentColor}
.flag{margin:.4rem 0;padding:.45rem .6rem;border-radius:6px}
.flag .label{text-transform:uppercase;letter-spacing:.03em;margin-right:.3rem}
.stored{margin:.3rem 0 0;overflow-wrap:anywhere}
:is(.badge,li,.flag).tone-ok{color:var(--ok)}
:is(.badge,li,.flag).tone-quiet{color:var(--muted)}
:is(.badge,li,.flag).tone-crash{color:var(--crash)}
:is(.badge,li,.flag).tone-denied{color:var(--denied)}
:is(.badge,li,.flag).tone-error{color:var(--error)}
:is(.badge,li,.flag).tone-pending{color:var(--pending)}
:is(.badge,li,.flag).tone-orphan{color:var(--orphan)}
:is(.badge,li,.flag).tone-stopped{color:var(--stopped)}
.badge.tone-edited{color:var(--edited)}
.call .edit{border-left:3px solid var(--edited);padding-left:.6rem;margin-top:.4rem}
.call .edit>.stored .k{color:var(--edited);font-weight:600}
details.instructions{margin:.35rem 0 0}
.badge.origin{font-weight:600;font-size:.7rem;letter-spacing:.02em;vertical-align:.08em}
.turn>h2 .badge.origin{vertical-align:.15em}
.badge.origin-scheduled{color:var(--scheduled)}
.badge.origin-self-resumed{color:var(--resumed)}
.badge.origin-stopped{color:var(--stopped)}
.msg.role-user.origin-scheduled{border-left-color:var(--scheduled)}
.flag.tone-crash{background:var(--crash-bg);color:var(--crash)}
.flag.tone-denied{background:var(--denied-bg);color:var(--denied)}
.flag.tone-error{background:var(--error-bg);color:var(--error)}
.flag.tone-pending{background:var(--pending-bg);color:var(--pending)}
.flag.tone-orphan{background:var(--orphan-bg);color:var(--orphan)}
.flag.tone-stopped{background:var(--stopped-bg);color:var(--stopped)}
.flag .why{color:var(--ink)}
.msg.tone-crash{border:2px solid var(--crash);border-left-width:6px}
.msg.tone-denied{border:2px solid var(--denied);border-left-width:6px}
.msg.tone-error{border-left-color:var(--error)}
.msg.tone-pending{border:2px solid var(--pending);border-left-width:6px}
.msg.tone-orphan{border:2px dashed var(--orphan);border-left-width:6px}
.msg.tone-stopped{border:2px solid var(--stopped);border-left-width:6px}
.msg.tone-stopped>header .who{color:var(--stopped)}
.msg.tone-crash>header .who{color:var(--crash)}
.msg.tone-denied>header .who{color:var(--denied)}
.attention .tone-crash,.attention .tone-denied,.attention .tone-pending,
.attention .tone-orphan,.attention .tone-stopped{font-weight:600}
.usage,.tokens{font-variant-numeric:tabular-nums}
footer{color:var(--muted);font-size:.8rem;margin-top:2rem}
.pages{display:flex;flex-wrap:wrap;align-items:center;gap:.4rem .6rem;margin:.8rem 0;
font-size:.9rem}
.pages a,.pages .off{border:1px solid var(--line);border-radius:6px;padding:.15rem .6rem;
background:var(--card);text-decoration:none}
.pages a:hover{border-color:var(--pending);color:var(--pending)}
.pages .off{color:var(--muted);opacity:.6}
.pages .range{font-weight:600;font-variant-numeric:tabular-nums;margin:0 .4rem}
details>summary{color:var(--muted);font-size:.8rem;cursor:pointer}
@media print{body{background:#fff;color:#000;font-size:11pt}main{max-width:none;padding:0}
.msg{border-color:#999}.attention{border-color:#000}a{text-decoration:none}.pages{display:none}}
"""
