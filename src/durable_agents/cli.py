"""The `durable-agents` command.

durable-agents demo [--db PATH]              crash a triage bot after its Slack post, resume it
durable-agents sessions list --db PATH       the sessions in a SQLite store
durable-agents sessions show ID --db PATH    one session's history (--json for machine use)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import ToolDurabilityError
from .llm.demo import DemoLLM
from .messages import Message
from .run import run
from .stores.base import Store
from .stores.sqlite import sqlite_store
from .tools import Handler, ToolContext
from .triage import Issue, IssueRef, SlackPost, SlackReceipt, triage_agent

DEMO_SESSION = "demo-triage-42"
DEMO_MESSAGE = "New issue came in: please triage issue 42."
CRASH_BEFORE_WRITE = 4  # write #2 of step 2: the post has happened, its result is not stored
ISSUES = {"42": Issue(id="42", title="Checkout fails with HTTP 500 for EU cards", status="open")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="durable-agents", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="crash a triage bot after its side effect, resume it")
    demo.add_argument("--db", type=Path, help="SQLite file to use (default: a new temp file)")
    demo.add_argument("--phase", choices=["crash", "resume"], help=argparse.SUPPRESS)
    sessions = commands.add_parser("sessions", help="inspect a SQLite store")
    which = sessions.add_subparsers(dest="action", required=True)
    listing = which.add_parser("list", help="sessions, most recently updated first")
    listing.add_argument("--db", type=Path, required=True)
    listing.add_argument("--limit", type=int, default=50)
    show = which.add_parser("show", help="one session's messages")
    show.add_argument("session_id")
    show.add_argument("--db", type=Path, required=True)
    show.add_argument("--json", action="store_true", help="print the messages as JSON")
    args = parser.parse_args(argv)

    if args.command == "demo":
        if args.phase:
            return asyncio.run(_demo_phase(args.phase, args.db))
        return _demo(args.db)
    if not args.db.exists():
        print(f"durable-agents: no database at {args.db}", file=sys.stderr)
        return 2
    if args.action == "list":
        return asyncio.run(_list_sessions(args.db, args.limit))
    return asyncio.run(_show_session(args.db, args.session_id, args.json))


# -- demo -----------------------------------------------------------------------------


def _demo(db: Path | None) -> int:
    """Run the crash phase in a child process that SIGKILLs itself, then resume here."""
    workdir = Path(tempfile.mkdtemp(prefix="durable-agents-demo-")) if db is None else None
    db = db or (workdir / "demo.db")  # type: ignore[operator]
    slack = _slack_log(db)
    for stale in (db, slack, Path(f"{db}-wal"), Path(f"{db}-shm")):
        stale.unlink(missing_ok=True)
    print("durable-agents demo: a triage bot whose process dies right after it posts to Slack\n")
    print(f"  store    {db} (SQLite, durable)")
    print(f"  session  {DEMO_SESSION}")
    print("  model    the offline demo model (no key, no network)\n")
    print(f'run 1: message "{DEMO_MESSAGE}"')
    sys.stdout.flush()
    child = subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", "demo", "--phase", "crash", "--db", str(db)],
        check=False,
    )
    killed = child.returncode == -signal.SIGKILL
    print(
        f"  ✗ the process was killed (exit {child.returncode}): write #{CRASH_BEFORE_WRITE}, "
        "post_slack's result, never happened\n"
        if killed
        else f"  the crash phase exited with {child.returncode}, expected SIGKILL\n"
    )
    if not killed:
        return 1
    print("run 2: a new process resumes the same session with message=None")
    sys.stdout.flush()
    return asyncio.run(_demo_phase("resume", db))


async def _demo_phase(phase: str, db: Path) -> int:
    store = sqlite_store(db)
    slack = _slack_log(db)
    tools: dict[str, Handler] = {"get_issue": _local_get_issue, "post_slack": _local_post_slack}
    try:
        if phase == "crash":
            await run(
                triage_agent(),
                llm=DemoLLM(),
                message=DEMO_MESSAGE,
                session_id=DEMO_SESSION,
                store=_Narrated(store, kill_before=CRASH_BEFORE_WRITE),
                tools=tools,
                deps=slack,
            )
            return 1  # not reached: the process kills itself
        result = await run(
            triage_agent(),
            llm=DemoLLM(),
            session_id=DEMO_SESSION,
            store=_Narrated(store),
            tools=tools,
            deps=slack,
        )
        history = await store.load_messages(DEMO_SESSION)
    finally:
        await store.close()
    errors = [e for e in map(ToolDurabilityError.from_message, history) if e is not None]
    for error in errors:
        print(
            f"  the LLM saw: {{'kind': '{error.kind}', 'toolName': '{error.tool_name}', "
            f"'toolCallId': '{error.tool_call_id}', 'error': '{_short(error.message, 60)}'}}"
        )
    print(f"  the LLM replied: {_wrap(result.response)}\n")
    posts = slack.read_text().splitlines() if slack.exists() else []
    print(f"Slack received {len(posts)} post(s):")
    for line in posts:
        print(f"  {line}")
    once = len(posts) == 1 and len(errors) == 1 and result.status == "complete"
    print(
        "\n✓ the post happened once; the LLM was told it may have happened and did not repeat it"
        if once
        else "\n✗ unexpected outcome"
    )
    print(f"\ninspect it: durable-agents sessions show {DEMO_SESSION} --db {db}")
    return 0 if once else 1


async def _local_get_issue(args: IssueRef, ctx: ToolContext) -> Issue:
    print(f"    tool  get_issue({args.id!r}) ran (safe_to_retry: a pure read)")
    issue = ISSUES.get(args.id)
    if issue is None:
        raise LookupError(f"no issue {args.id!r}")
    return issue


async def _local_post_slack(args: SlackPost, ctx: ToolContext) -> SlackReceipt:
    log: Path = ctx.deps
    with log.open("a") as f:
        f.write(f"{args.channel}  {args.text}  (Idempotency-Key {ctx.idempotency_key[:15]}…)\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"    tool  post_slack({args.channel!r}) ran: Slack received the post")
    return SlackReceipt(ok=True, status_code=200)


def _slack_log(db: Path) -> Path:
    return db.with_name(db.name + ".slack.log")


class _Narrated:
    """A store that narrates each atomic write, and can kill the process before one."""

    def __init__(self, inner: Store, kill_before: int | None = None) -> None:
        self.inner = inner
        self.kill_before = kill_before
        self.writes = 0
        self.durable = inner.durable

    async def load_messages(self, session_id: str) -> list[Message]:
        messages = await self.inner.load_messages(session_id)
        if messages:
            print(
                f"    load  {len(messages)} stored messages; the last asks for "
                f"{', '.join(c.name for c in messages[-1].tool_calls) or 'nothing'} "
                "with no result stored"
            )
        return messages

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: Sequence[Message], **kw: Any
    ) -> int:
        self.writes += 1
        if self.writes == self.kill_before:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        count = await self.inner.append_messages_atomic(session_id, expected_seq, messages, **kw)
        print(f"    write #{self.writes}: {'; '.join(_describe(m) for m in messages)}")
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _describe(message: Message) -> str:
    if message.role == "user":
        return f'user "{_short(message.content, 40)}"'
    if message.role == "assistant":
        calls = ", ".join(
            f"{c.name}({_short(json.dumps(c.arguments), 40)})" for c in message.tool_calls
        )
        return f"assistant asks {calls}" if calls else f'assistant "{_short(message.content, 50)}"'
    error = ToolDurabilityError.from_message(message)
    if error is not None:
        return f"{message.tool_name} result = tool-durability-error (not re-invoked)"
    return f"{message.tool_name} result {_short(message.content, 50)}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _wrap(text: str) -> str:
    return textwrap.fill(text, 88, subsequent_indent="    ")


# -- sessions -------------------------------------------------------------------------


async def _list_sessions(db: Path, limit: int) -> int:
    store = sqlite_store(db)
    try:
        sessions = await store.list_sessions(limit=limit)
    finally:
        await store.close()
    if not sessions:
        print("no sessions")
        return 0
    print(f"{'session':<40} {'agent':<12} {'state':<22} {'msgs':>5}  updated (UTC)")
    for s in sessions:
        print(
            f"{_short(s.id, 40):<40} {s.agent_name or '-':<12} {s.state:<22} "
            f"{s.message_count:>5}  {_time(s.updated_at)}"
        )
    return 0


async def _show_session(db: Path, session_id: str, as_json: bool) -> int:
    store = sqlite_store(db)
    try:
        info = await store.get_session(session_id)
        messages = await store.load_messages(session_id)
    finally:
        await store.close()
    if info is None:
        print(f"durable-agents: no session {session_id!r} in {db}", file=sys.stderr)
        return 1
    if as_json:
        print(
            json.dumps(
                {"session_id": session_id, "messages": [m.to_dict() for m in messages]},
                ensure_ascii=False,
                indent=2,
            )
        )
        return 0
    print(
        f"session {session_id}  agent {info.agent_name}  state {info.state}  "
        f"created {_time(info.created_at)}"
    )
    for seq, m in enumerate(messages):
        print(f"{seq:>4}  {_describe(m)}")
    return 0


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


if __name__ == "__main__":
    sys.exit(main())
