"""The `durable-agents` command: look into a store's sessions, run its worker.

    durable-agents sessions list [--limit N] [--cursor C] [--json]
    durable-agents sessions show NAME_OR_ID [--json | --html OUT.html]
    durable-agents worker --db FILE_OR_URL --app MODULE:ATTR [--poll SECONDS] [--once]

`worker` resumes the turns of a SQLite or PostgreSQL store whose process died and fires its
due schedules (`durable_agents.worker`), with the agent, LLM and handlers that
`--app` names: a `Runner`, or a function returning one, in MODULE (importable
from the current directory too). Safe to run twice at once.

Where the sessions are, one of:

    --db PATH    a SQLite store (`sqlite_store(PATH)`)
    --db URL     a PostgreSQL store (`postgres_store(URL)`, a postgresql:// URL; the
                 `postgres` extra)
    --d1 DIR     the local D1 database of `scripts/dev` (its --persist-to directory,
                 default .wrangler/state), read-only: the server may be running

Without either, the dev server's default state (.wrangler/state) if it exists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sqlite3
import sys
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import worker
from .approvals import approval_states
from .errors import (
    ConfigurationError,
    DurableAgentsError,
    InvalidCursorError,
    ToolDurabilityError,
)
from .messages import Message, ToolCall, ToolErrorKind, pending_tool_calls, tool_error
from .run import DEFERRED_REASON
from .schedules import fired_by
from .session_links import SessionLinks, find_links
from .stores.base import ApprovalEvent, SessionInfo
from .stores.postgres import PostgresStore, postgres_store
from .stores.sqlite import SQLiteStore, sqlite_store
from .timeline import render_timeline

DEFAULT_D1_STATE = Path(".wrangler/state")  # scripts/dev's default --persist-to
D1_OBJECTS = Path("v3/d1/miniflare-D1DatabaseObject")  # where miniflare keeps D1 databases


# The stores the command opens: by --db's form, a file or a postgresql:// URL.
CommandStore = SQLiteStore | PostgresStore
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class CommandError(Exception):
    """A problem with what the command was given: printed, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="durable-agents", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sessions = commands.add_parser("sessions", help="list and show stored sessions")
    which = sessions.add_subparsers(dest="action", required=True)

    source = argparse.ArgumentParser(add_help=False)
    where = source.add_mutually_exclusive_group()
    where.add_argument(
        "--db", metavar="FILE_OR_URL", help="a SQLite store file or a postgresql:// URL"
    )
    where.add_argument(
        "--d1",
        type=Path,
        metavar="DIR",
        help=f"scripts/dev's state directory (its --persist-to; default {DEFAULT_D1_STATE}) "
        "or a D1 .sqlite file; opened read-only",
    )
    listing = which.add_parser(
        "list", parents=[source], help="sessions, newest created first, a page at a time"
    )
    listing.add_argument("--limit", type=_positive, default=50, help="sessions per page (50)")
    listing.add_argument("--cursor", help="the next cursor a previous page printed")
    listing.add_argument("--json", action="store_true", help="print the page as JSON")
    show = which.add_parser(
        "show", parents=[source], help="one session, by id, else by name (the newest)"
    )
    show.add_argument("session", metavar="NAME_OR_ID")
    output = show.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the messages as JSON")
    output.add_argument(
        "--html", type=Path, metavar="OUT", help="write the session's timeline page (- for stdout)"
    )
    working = commands.add_parser(
        "worker", help="resume crashed turns and fire due schedules of a store"
    )
    working.add_argument(
        "--db", required=True, metavar="FILE_OR_URL",
        help="a SQLite store file or a postgresql:// URL",
    )  # fmt: skip
    working.add_argument(
        "--app", required=True, metavar="MODULE:ATTR", help="a Runner, or a function returning one"
    )
    working.add_argument(
        "--poll", type=_seconds, default=1.0, help="seconds between passes (1)", metavar="SECONDS"
    )
    working.add_argument("--once", action="store_true", help="one pass, then exit (1 on an error)")
    working.add_argument("--limit", type=_positive, default=100, help="items per pass (100)")
    working.add_argument(
        "--max-resumes", type=_positive, default=3, metavar="N",
        help="resumes in a row of a turn that keeps crashing before it is stopped (3)",
    )  # fmt: skip
    working.add_argument(
        "--backoff", type=_seconds, default=10.0, metavar="SECONDS",
        help="wait before the 2nd resume of a crashed turn, doubling after (10)",
    )  # fmt: skip
    working.add_argument("--quiet", action="store_true", help="log errors only")
    args = parser.parse_args(argv)

    try:
        if args.command == "worker":
            return _worker(args)
        store = _open(args.db, args.d1)
        if args.action == "list":
            return asyncio.run(_list_sessions(store, args.limit, args.cursor, args.json))
        return _show_session(store, args.session, args.json, args.html)
    except CommandError as exc:
        print(f"durable-agents: {exc}", file=sys.stderr)
        return 2


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < 86400 * 366:
        raise argparse.ArgumentTypeError("must be 0 or more seconds")
    return value


# -- the worker -----------------------------------------------------------------------------


def _worker(args: argparse.Namespace) -> int:
    if not args.poll > 0:
        raise CommandError("--poll must be more than 0 seconds")
    store = _open(args.db, None)
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # --app's module may be a file here
    try:
        runner = worker.load_runner(args.app)
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from None
    logging.basicConfig(
        level=logging.ERROR if args.quiet else logging.INFO,
        format="durable-agents worker: %(message)s",
        stream=sys.stderr,
    )
    if args.once:
        return asyncio.run(_work_once(runner, store, args))
    asyncio.run(_serve(runner, store, args))
    return 0


async def _work_once(runner: worker.Runner[Any], store: CommandStore, args: Any) -> int:
    try:
        report = await worker.work_once(
            runner, store, limit=args.limit, max_resumes=args.max_resumes,
            backoff_seconds=args.backoff,
        )  # fmt: skip
    except DurableAgentsError as exc:  # the store could not be listed
        raise CommandError(_store_problem(exc)) from None
    finally:
        await store.close()
    worker.log_report(report)
    return 1 if report.errors else 0


async def _serve(runner: worker.Runner[Any], store: CommandStore, args: Any) -> None:
    """Passes until SIGTERM or SIGINT: the turn under way finishes first (a second
    SIGINT interrupts it; a turn cut short is resumed by the next worker)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        stop.set()
        loop.remove_signal_handler(signum)  # the next one acts as usual

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await worker.serve(
            runner, store, poll=args.poll, stop=stop, limit=args.limit,
            max_resumes=args.max_resumes, backoff_seconds=args.backoff,
        )  # fmt: skip
    finally:
        await store.close()


# -- where the sessions are -----------------------------------------------------------------


class ReadOnlySQLiteStore(SQLiteStore):
    """A SQLite store opened read-only (`mode=ro`): no migration, no write, no
    journal-mode change. For a database another process owns (the dev server's D1)."""

    def _connect(self) -> sqlite3.Connection:
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 10000")
        return conn


def _open(db: str | None, d1: Path | None) -> CommandStore:
    if db is not None and db.startswith(POSTGRES_SCHEMES):
        try:
            return postgres_store(db)
        except ConfigurationError as exc:  # the extra is not installed
            raise CommandError(str(exc)) from None
    if db is not None:
        if not Path(db).is_file():
            raise CommandError(f"no database at {db}")
        return sqlite_store(db)
    if d1 is None:
        if not DEFAULT_D1_STATE.is_dir():
            raise CommandError(
                f"say where the sessions are: --db PATH (a SQLite store) or --d1 DIR "
                f"(scripts/dev's state; there is no {DEFAULT_D1_STATE} here)"
            )
        d1 = DEFAULT_D1_STATE
    return ReadOnlySQLiteStore(d1_database(d1))


def d1_database(path: Path) -> Path:
    """The SQLite file of the kit's D1 database in a dev server's state directory
    (or `path` itself if it is a file)."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise CommandError(f"no dev server state at {path}")
    folders = [path / D1_OBJECTS, path / "d1" / "miniflare-D1DatabaseObject", path]
    files = sorted(
        (
            f
            for d in folders
            if d.is_dir()
            for f in d.glob("*.sqlite")
            if f.name != "metadata.sqlite"
        ),
        key=lambda f: f.stat().st_mtime,
        reverse=True,
    )
    ours = [f for f in files if _has_sessions(f)]
    if not ours:
        raise CommandError(
            f"no D1 database with sessions under {path} (looked in {path / D1_OBJECTS}); "
            "has scripts/dev --persist-to this directory served a turn?"
        )
    if len(ours) > 1:
        print(f"durable-agents: {len(ours)} D1 databases under {path}; reading the newest, "
              f"{ours[0].name}", file=sys.stderr)  # fmt: skip
    return ours[0]


def _has_sessions(path: Path) -> bool:
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'agent_sessions'"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return found is not None


# -- sessions -------------------------------------------------------------------------------


async def _list_sessions(store: CommandStore, limit: int, cursor: str | None, as_json: bool) -> int:
    try:
        page = await store.list_sessions(limit=limit, cursor=cursor)
    except InvalidCursorError:
        raise CommandError(
            f"not a cursor this store handed out: {cursor!r} (start again without --cursor)"
        ) from None
    except DurableAgentsError as exc:
        raise CommandError(_store_problem(exc)) from None
    finally:
        await store.close()
    if as_json:
        listed = [_session_json(s) for s in page.sessions]
        print(json.dumps({"sessions": listed, "next_cursor": page.next_cursor}, indent=2))
        return 0
    if not page.sessions:
        print("no sessions" if cursor is None else "no more sessions")
        return 0
    header = ("name", "session id", "agent", "state", "msgs", "tokens in/out",
              "created (UTC)", "updated (UTC)")  # fmt: skip
    rows = [
        (
            _printable(s.name or s.id),
            s.id,
            _printable(s.agent_name or "-"),
            s.state,
            str(s.message_count),
            f"{s.input_tokens:,}/{s.output_tokens:,}",
            _time(s.created_at),
            _time(s.updated_at),
        )
        for s in page.sessions
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in (4, 5) else c.ljust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True))]  # fmt: skip
        print("  ".join(cells).rstrip())
    if page.next_cursor is not None:
        print(f"next cursor: {page.next_cursor}  (--cursor {page.next_cursor} for the next page)")
    return 0


Shown = tuple[SessionInfo, list[tuple[int, Message]], list[ApprovalEvent], SessionLinks]


def _page_file(name: str, agent: str | None) -> str:
    """Where `--html` links a session's page: the file `NAME.html` beside it (what
    `sessions show NAME --html NAME.html` writes)."""
    return f"{quote(name, safe='')}.html"


async def _load_session(store: CommandStore, wanted: str) -> Shown | None:
    """The session `wanted` names (an id, else a name: the newest of that name), with its
    links to its parent call and child sessions."""
    try:
        info = await store.get_session(wanted)
        if info is None:
            named = await store.find_sessions(wanted)
            if not named:
                return None
            info = named[0]
            if len(named) > 1:
                others = ", ".join(s.id for s in named[1:])
                print(f"durable-agents: {len(named)} sessions are named {_printable(wanted)!r}; "
                      f"showing the newest ({info.id}); the others: {others}",
                      file=sys.stderr)  # fmt: skip
        timeline = await store.load_timeline(info.id)
        links = await find_links(store, info.id, (m for _, m in timeline), href=_page_file)
        return info, timeline, await store.load_approvals(info.id), links
    except DurableAgentsError as exc:
        raise CommandError(_store_problem(exc)) from None
    finally:
        await store.close()


def _show_session(store: CommandStore, wanted: str, as_json: bool, html_out: Path | None) -> int:
    found = asyncio.run(_load_session(store, wanted))
    if found is None:
        print(f"durable-agents: no session {_printable(wanted)!r} (by id or name)", file=sys.stderr)
        return 1
    info, timeline, approvals, links = found
    if html_out is not None:
        _write_timeline_page(info, timeline, approvals, links, html_out)
    elif as_json:
        _print_session_json(info, timeline, approvals, links)
    else:
        _print_session(info, timeline, links)
        _print_approvals(approvals, _tool_calls(timeline))
        _print_waiting(timeline, approvals)
    return 0


def _tool_calls(timeline: list[tuple[int, Message]]) -> dict[str, ToolCall]:
    """The session's tool calls by id."""
    return {c.id: c for _, m in timeline for c in m.tool_calls}


def _write_timeline_page(
    info: SessionInfo,
    timeline: list[tuple[int, Message]],
    approvals: list[ApprovalEvent],
    links: SessionLinks,
    html_out: Path,
) -> None:
    """`--html OUT`: the session's timeline page, to OUT (`-`: standard output); it links
    a parent and child sessions as the files `NAME.html` beside it."""
    name = info.name or info.id
    page = render_timeline(
        name=name, session_id=info.id, agent=info.agent_name, entries=timeline,
        approvals=approvals, links=links,
    )  # fmt: skip
    if str(html_out) == "-":
        sys.stdout.write(page)
    else:
        html_out.write_text(page, encoding="utf-8")
        print(f"wrote {html_out} (session {_printable(name)}, {len(timeline)} messages)")


def _print_session_json(
    info: SessionInfo,
    timeline: list[tuple[int, Message]],
    approvals: list[ApprovalEvent],
    links: SessionLinks,
) -> None:
    calls = _tool_calls(timeline)
    parent = links.parent
    data = {
        **_session_json(info),
        "parent": None if parent is None else {
            "session_id": parent.session_id, "name": parent.name, "tool_call_id": parent.call_id,
        },
        "children": [
            {"tool_call_id": c.call_id, "session_id": c.session_id, "name": c.name}
            for c in links.children.values()
        ],
        "messages": [m.to_dict() for _, m in timeline],
        "approvals": [_approval_json(e, calls.get(e.tool_call_id)) for e in approvals],
    }  # fmt: skip
    print(json.dumps(data, ensure_ascii=False, indent=2))


def _print_session(
    info: SessionInfo, timeline: list[tuple[int, Message]], links: SessionLinks
) -> None:
    """The session's header, then one line per message, each call's child session (an
    agent tool's) on a line of its own."""
    print(f"session {_printable(info.name or info.id)}")
    print(f"  id       {info.id}")
    print(f"  agent    {_printable(info.agent_name or '-')}    state {info.state}")
    print(f"  created  {_time(info.created_at)} UTC    updated {_time(info.updated_at)} UTC")
    print(f"  messages {info.message_count}    tokens {info.input_tokens:,} in / "
          f"{info.output_tokens:,} out")  # fmt: skip
    parent = links.parent
    if parent is not None:
        print(f"  parent   session {_printable(parent.name)} (id {_printable(parent.session_id)}), "
              f"call {_printable(parent.call_id)}")  # fmt: skip
    for seq, (ms, m) in enumerate(timeline):
        print(f"{seq:>4}  {_time(ms)[11:]}  {_printable(_describe(m))}")
        for call in m.tool_calls:
            child = links.children.get(call.id)
            if child is not None:
                print(f"                  {_printable(call.id)} -> child session "
                      f"{_printable(child.name)}")  # fmt: skip


def _print_approvals(approvals: list[ApprovalEvent], calls: dict[str, ToolCall]) -> None:
    """One line per approval event; an edit also shows both versions of the arguments."""
    # A call the kit deferred is stored as requested and approved by the kit: one line.
    deferred = {e.tool_call_id for e in approvals if e.reason == DEFERRED_REASON}
    shown = [e for e in approvals if e.event != "requested" or e.tool_call_id not in deferred]
    if shown:
        print("approvals")
    for e in shown:
        print(f"      {_time(e.created_at)[11:]}  {_printable(_describe_approval(e))}")
        if e.arguments is not None:  # both versions: what the model asked, what runs
            asked = calls.get(e.tool_call_id)
            for label, arguments in (
                ("the model's", asked.arguments if asked else None),
                ("runs with", e.arguments),
            ):
                if arguments is not None:
                    text = _short(json.dumps(arguments, ensure_ascii=False), 100)
                    print(f"                {label:<11}  {_printable(text)}")


def _print_waiting(timeline: list[tuple[int, Message]], approvals: list[ApprovalEvent]) -> None:
    """A line for each pending call still waiting for its approval decision."""
    states = approval_states(approvals)
    for call in pending_tool_calls([m for _, m in timeline]):
        state = states.get(call.id)
        if state is not None and state.decision is None:
            print(f"waiting for approval: {_printable(call.name)} (call {_printable(call.id)}, "
                  f"digest {state.digest[:12]}…)")  # fmt: skip


def _session_json(s: SessionInfo) -> dict[str, Any]:
    """A session as `GET /sessions` lists it (with its state)."""
    return s.to_dict()


def _approval_json(e: ApprovalEvent, call: ToolCall | None = None) -> dict[str, Any]:
    """An event as `--json` lists it; an approval with an edit (`arguments`, the approver's,
    and their `arguments_digest`) also has `model_arguments`, those of the stored call."""
    data = {
        "tool_call_id": e.tool_call_id, "tool_name": e.tool_name, "event": e.event,
        "digest": e.digest, "reason": e.reason, "created_at": e.created_at,
        "arguments": e.arguments, "arguments_digest": e.arguments_digest,
    }  # fmt: skip
    if e.arguments is not None and call is not None:
        data["model_arguments"] = call.arguments
    return data


def _describe_approval(e: ApprovalEvent) -> str:
    """One line for an approval event: who decided what about which call."""
    call = f"{e.tool_name} (call {e.tool_call_id})"
    if e.event == "requested":
        return f"{call} needs approval (digest {e.digest[:12]}…)"
    if e.event == "claimed":
        return f"{call} started (claimed: its handler runs once)"
    if e.event == "approved" and e.reason == DEFERRED_REASON:
        return f"{call} deferred by the kit to a fresh invocation (its fetch budget ran out)"
    reason = f": {_short(e.reason, 60)}" if e.reason else ""
    edited = ", arguments edited" if e.arguments is not None else ""
    return f"{call} {e.event}{edited}{reason}"


def _store_problem(exc: DurableAgentsError) -> str:
    return (
        f"{exc} (a store written before this version of the kit? a dev server applies "
        "the migrations when it starts; a SQLite store when it is opened with --db)"
    )


def _describe(message: Message) -> str:
    """One line for a message; `[scheduled]`, `[self-resumed]`, `[stopped]` or
    `[agent-tool]` first for one no client wrote (a schedule's turn, a resume nobody asked
    for, the kit's stop note, a turn another session's agent tool ran); a scheduled turn's
    user message also names its schedule (`schedules.fired_by`)."""
    text = _describe_content(message)
    by = fired_by(message.request_key) if message.origin == "scheduled" else None
    origin = message.origin if by is None else f"{message.origin}: {by}"
    return text if message.origin is None else f"[{origin}] {text}"


def _describe_content(message: Message) -> str:
    if message.role in ("user", "system"):
        sent = message.instructions
        instructions = "" if sent is None else f' (instructions "{_short(sent, 30)}")'
        return f'{message.role} "{_short(message.content, 60)}"{instructions}'
    if message.role == "assistant":
        calls = ", ".join(
            f"{c.name}({_short(json.dumps(c.arguments, ensure_ascii=False), 40)})"
            for c in message.tool_calls
        )
        return f"assistant asks {calls}" if calls else f'assistant "{_short(message.content, 60)}"'
    if ToolDurabilityError.from_message(message) is not None:
        return f"{message.tool_name} result = tool-durability-error (not re-invoked)"
    error = tool_error(message.content)
    if error is not None:
        kind = error.get("kind") or "error"
        if kind == ToolErrorKind.TOOL_DENIED:
            return f"{message.tool_name} result = tool-denied (reason: {error.get('reason')})"
        return f"{message.tool_name} result = {kind}: {_short(str(error.get('error')), 50)}"
    return f"{message.tool_name} result {_short(message.content, 60)}"


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _printable(text: str) -> str:
    """`text` with control and format characters escaped: stored text never drives the
    terminal (no escape sequence, no line break, no bidi override)."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Cf")
        else ch
        for ch in text
    )


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


if __name__ == "__main__":
    sys.exit(main())
