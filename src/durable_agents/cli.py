"""The `durable-agents` command: look into a SQLite store.

durable-agents sessions list --db PATH       the sessions in a SQLite store
durable-agents sessions show ID --db PATH    one session's history (--json for machine use)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from .errors import ToolDurabilityError
from .messages import Message
from .stores.sqlite import sqlite_store


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="durable-agents", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
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

    if not args.db.exists():
        print(f"durable-agents: no database at {args.db}", file=sys.stderr)
        return 2
    if args.action == "list":
        return asyncio.run(_list_sessions(args.db, args.limit))
    return asyncio.run(_show_session(args.db, args.session_id, args.json))


# -- sessions -------------------------------------------------------------------------


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
