"""The contract without the Worker: the triage bot dies right after its Slack post.

    python -m examples.triage.demo [--db PATH]

Runs the triage example (`examples/triage/agent.py`) on a SQLite file with
its offline model, in a child process that SIGKILLs itself after the post
happened and before its result is stored; then a new process resumes the
session and shows the post happened once and the model was told
(`tool-durability-error`). The tools are swapped for offline ones by name
(`run(..., tools=...)`): the issue comes from a dict, and "Slack" is a log
file next to the database.
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from durable_agents import Agent, Message, Store, ToolContext, ToolDurabilityError, run
from durable_agents.llm import FunctionLLM
from durable_agents.stores import sqlite_store

from .agent import AGENT, Issue, IssueRef, SlackPost, SlackReceipt, play_triage

ROOT = Path(__file__).resolve().parents[2]  # where `python -m examples.triage.demo` runs
SESSION = "demo-triage-42"
MESSAGE = "New issue came in: please triage issue 42."
CRASH_BEFORE_WRITE = 4  # write #2 of step 2: the post has happened, its result is not stored
# The demo swaps the HTTP handlers for offline ones, and their deps for a log file.
OFFLINE_AGENT: Agent[Any] = AGENT
ISSUES = {"42": Issue(id="42", title="Checkout fails with HTTP 500 for EU cards", status="open")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.triage.demo", description=__doc__)
    parser.add_argument("--db", type=Path, help="SQLite file to use (default: a new temp file)")
    parser.add_argument("--phase", choices=["crash", "resume"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        return asyncio.run(phase(args.phase, args.db))
    return demo(args.db)


def demo(db: Path | None) -> int:
    """Run the crash phase in a child process that SIGKILLs itself, then resume here."""
    if db is None:
        db = Path(tempfile.mkdtemp(prefix="durable-agents-demo-")) / "demo.db"
    for stale in (db, slack_log(db), Path(f"{db}-wal"), Path(f"{db}-shm")):
        stale.unlink(missing_ok=True)
    print("triage demo: a triage bot whose process dies right after it posts to Slack\n")
    print(f"  store    {db} (SQLite, durable)")
    print(f"  session  {SESSION}")
    print("  model    the example's offline model (no key, no network)\n")
    print(f'run 1: message "{MESSAGE}"')
    sys.stdout.flush()
    child = subprocess.run(
        [sys.executable, "-m", "examples.triage.demo", "--phase", "crash", "--db", str(db)],
        cwd=ROOT,
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
    return asyncio.run(phase("resume", db))


async def phase(which: str, db: Path) -> int:
    store = sqlite_store(db)
    slack = slack_log(db)
    tools: dict[str, Callable[[Any, ToolContext], Awaitable[Any]]] = {
        "get_issue": local_get_issue,
        "post_slack": local_post_slack,
    }
    llm = FunctionLLM(play_triage)
    try:
        if which == "crash":
            dying = Narrated(store, kill_before=CRASH_BEFORE_WRITE)
            await run(
                OFFLINE_AGENT, llm=llm, message=MESSAGE, session_id=SESSION, store=dying,
                tools=tools, deps=slack,
            )  # fmt: skip
            return 1  # not reached: the process kills itself
        result = await run(
            OFFLINE_AGENT,
            llm=llm,
            session_id=SESSION,
            store=Narrated(store),
            tools=tools,
            deps=slack,
        )
        history = await store.load_messages(SESSION)
    finally:
        await store.close()
    errors = [e for e in map(ToolDurabilityError.from_message, history) if e is not None]
    for error in errors:
        print(
            f"  the model saw: {{'kind': '{error.kind}', 'toolName': '{error.tool_name}', "
            f"'toolCallId': '{error.tool_call_id}', 'error': '{short(error.message, 60)}'}}"
        )
    print(f"  the model replied: {textwrap.fill(result.response, 88, subsequent_indent='    ')}\n")
    posts = slack.read_text().splitlines() if slack.exists() else []
    print(f"Slack received {len(posts)} post(s):")
    for line in posts:
        print(f"  {line}")
    once = len(posts) == 1 and len(errors) == 1 and result.status == "complete"
    print(
        "\n✓ the post happened once; the model was told it may have happened and did not repeat it"
        if once
        else "\n✗ unexpected outcome"
    )
    print(f"\ninspect it: durable-agents sessions show {SESSION} --db {db}")
    return 0 if once else 1


async def local_get_issue(args: IssueRef, ctx: ToolContext) -> Issue:
    print(f"    tool  get_issue({args.id!r}) ran (safe_to_retry: a pure read)")
    issue = ISSUES.get(args.id)
    if issue is None:
        raise LookupError(f"no issue {args.id!r}")
    return issue


async def local_post_slack(args: SlackPost, ctx: ToolContext) -> SlackReceipt:
    log: Path = ctx.deps
    with log.open("a") as f:
        f.write(f"{args.channel}  {args.text}  (Idempotency-Key {ctx.idempotency_key[:15]}…)\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"    tool  post_slack({args.channel!r}) ran: Slack received the post")
    return SlackReceipt(ok=True, status_code=200)


def slack_log(db: Path) -> Path:
    return db.with_name(db.name + ".slack.log")


class Narrated:
    """A store that narrates each atomic write, and can kill the process before one."""

    def __init__(self, inner: Store, kill_before: int | None = None) -> None:
        self.inner = inner
        self.kill_before = kill_before
        self.writes = 0
        self.durable = inner.durable

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        base, messages = await self.inner.load_context(session_id)
        if messages:
            print(
                f"    load  {len(messages)} stored messages; the last asks for "
                f"{', '.join(c.name for c in messages[-1].tool_calls) or 'nothing'} "
                "with no result stored"
            )
        return base, messages

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        return await self.inner.load_messages(session_id, start=start, limit=limit)

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: Sequence[Message], **kw: Any
    ) -> int:
        self.writes += 1
        if self.writes == self.kill_before:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        count = await self.inner.append_messages_atomic(session_id, expected_seq, messages, **kw)
        print(f"    write #{self.writes}: {'; '.join(describe(m) for m in messages)}")
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def describe(message: Message) -> str:
    if message.role == "user":
        return f'user "{short(message.content, 40)}"'
    if message.role == "assistant":
        calls = ", ".join(
            f"{c.name}({short(json.dumps(c.arguments), 40)})" for c in message.tool_calls
        )
        return f"assistant asks {calls}" if calls else f'assistant "{short(message.content, 50)}"'
    if ToolDurabilityError.from_message(message) is not None:
        return f"{message.tool_name} result = tool-durability-error (not re-invoked)"
    return f"{message.tool_name} result {short(message.content, 50)}"


def short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


if __name__ == "__main__":
    sys.exit(main())
