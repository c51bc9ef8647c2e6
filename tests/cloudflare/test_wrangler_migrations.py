"""The migrations (wrangler.toml's migrations_dir) upgrade a deployed D1 database with
wrangler, offline, and the Worker serves it.

With `wrangler d1 migrations apply --local` (runtime/node's Node, runtime/workerd) on a
state directory: every migration but the last; a session written the old way (as a
Worker of that schema wrote it); then the last migration, as a deployed database gets
it, checked on the old rows. Then this repo's Worker on real workerd (`scripts/dev
--persist-to` that state: `wrangler dev`) finds, extends, lists and pages the sessions;
`wrangler d1 execute --local` reads back what the Worker wrote. Needs
`scripts/setup-runtime`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import sqlite3
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.support.served_worker import runtime_module

from durable_agents.stores import _schema

PROJECT = Path(__file__).resolve().parents[2]
KIT = tomllib.loads((PROJECT / "wrangler.toml").read_text())
DATABASE = KIT["d1_databases"][0]
TOKEN = "dev-token"  # the dev server's API_TOKEN when none is set


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, PROJECT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


dev_process = _script("dev_process")
local_object_id = runtime_module("dev").local_object_id  # a session's object id


UNIQUE_KEY = f"{KIT['name']}-{KIT['durable_objects']['bindings'][0]['class_name']}"
OLD = local_object_id(UNIQUE_KEY, "old-session")


def applied(output: str) -> list[str]:
    """The migrations `wrangler d1 migrations apply` reports applied (its table's rows)."""
    return list(dict.fromkeys(re.findall(r"│\s*(\S+\.sql)\s*│\s*✅", output)))


def _objects(connection: sqlite3.Connection) -> list[tuple[str, str, str, str]]:
    """The kit's tables, indexes and triggers as the database holds them (their SQL)."""
    return connection.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name LIKE 'agent_%' "
        "ORDER BY type, name"
    ).fetchall()


def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def test_wrangler_upgrades_old_rows_and_the_worker_serves_them(tmp_path: Path) -> None:
    files = sorted((PROJECT / DATABASE["migrations_dir"]).glob("*.sql"))
    # The rows below are of the schema before session names (0004); every later
    # migration is applied over them, in one `apply`.
    split = [f.name for f in files].index("0004_session_names.sql")
    before, later = files[:split], files[split:]
    project, state = tmp_path / "project", tmp_path / "state"
    (project / "migrations").mkdir(parents=True)
    for file in before:
        shutil.copy2(file, project / "migrations" / file.name)
    config = project / "wrangler.json"
    config.write_text(
        json.dumps(
            {
                "name": KIT["name"],
                "compatibility_date": KIT["compatibility_date"],
                "d1_databases": [{**DATABASE, "migrations_dir": "migrations"}],
            }
        )
    )
    name = DATABASE["database_name"]
    local = ["--local", "--persist-to", str(state), "--config", str(config)]

    def execute(command: str) -> list[list[dict[str, Any]]]:
        """The rows of each statement of `command`, run by `wrangler d1 execute`."""
        output = dev_process.wrangler(
            ["d1", "execute", name, *local, "--json", "--command", command]
        )
        return [statement["results"] for statement in json.loads(output)]

    def d1(sql: str) -> list[dict[str, Any]]:
        return execute(sql)[0]

    def d1_each(*sql: str) -> list[list[dict[str, Any]]]:
        """The rows of each query, read by one wrangler call (one Node start, not one each)."""
        results = execute("; ".join(sql))
        assert len(results) == len(sql), results
        return results

    # What the dev server reads of wrangler's record, before it starts wrangler dev.
    dev = runtime_module("dev")
    worker_config = json.loads(config.read_text())

    def pending() -> list[str]:
        return [db["binding"] for db in dev.pending_migrations(config, worker_config, state)]

    assert pending() == ["DB"]  # no database yet
    # The database as a Worker of the older schema left it.
    assert applied(dev_process.wrangler(["d1", "migrations", "apply", name, *local])) == [
        f.name for f in before
    ]
    assert dev.d1_file(state, DATABASE).is_file()  # where wrangler keeps it
    assert pending() == []  # every file of the folder recorded
    d1(
        f"INSERT INTO agent_sessions VALUES ('{OLD}', 'triage', 'idle', 2, 1000, 2000); "
        "INSERT INTO agent_messages (session_id, seq, role, content, input_tokens, "
        f"output_tokens, created_at) VALUES ('{OLD}', 0, 'user', 'q', NULL, NULL, 1000), "
        f"('{OLD}', 1, 'assistant', 'a', 12, 5, 2000); "
        "INSERT INTO agent_approvals (session_id, tool_call_id, event, tool_name, digest, reason, "
        "created_at) VALUES ('gone', 'r1', 'requested', 'refund', 'd1', NULL, 1500), "
        "('gone', 'r1', 'approved', 'refund', 'd1', 'ann: ok', 1600)"
    )

    # The later migrations, over the old rows.
    for file in later:
        shutil.copy2(file, project / "migrations" / file.name)
    assert pending() == ["DB"]
    assert applied(dev_process.wrangler(["d1", "migrations", "apply", name, *local])) == [
        f.name for f in later
    ]
    assert pending() == []
    # What the migrations made of the old rows, and the schema, read by one wrangler call.
    named, summaries, instructions, approvals, schema = d1_each(
        f"SELECT name, input_tokens, output_tokens FROM agent_sessions WHERE id = '{OLD}'",
        f"SELECT summary_of FROM agent_messages WHERE session_id = '{OLD}'",
        f"SELECT instructions FROM agent_messages WHERE session_id = '{OLD}'",
        "SELECT event, reason, arguments, arguments_digest FROM agent_approvals",
        "SELECT name FROM sqlite_master WHERE name LIKE 'agent_%'",
    )
    assert named == [{"name": OLD, "input_tokens": 12, "output_tokens": 5}], (
        "0004_session_names.sql did not name and sum the old session"
    )
    assert summaries == [{"summary_of": None}, {"summary_of": None}]
    # 0007: no instructions on the old messages, no edit on the old approval...
    assert instructions == [{"instructions": None}, {"instructions": None}]
    assert approvals == [
        {"event": "requested", "reason": None, "arguments": None, "arguments_digest": None},
        {"event": "approved", "reason": "ann: ok", "arguments": None, "arguments_digest": None},
    ]
    # ...and only an approval may carry one, with its digest.
    for event, digest in (("denied", "'e1'"), ("approved", "NULL")):
        with pytest.raises(SystemExit, match="CHECK constraint failed"):
            d1(
                "INSERT INTO agent_approvals (session_id, tool_call_id, event, tool_name, digest, "
                f"created_at, arguments, arguments_digest) VALUES ('gone', 'r2', '{event}', "
                f"'refund', 'd2', 1700, '{{}}', {digest})"
            )
    created: set[str] = set()  # each object a file creates, unless a later file drops it
    for file in files:
        for verb, made in re.findall(
            r"(CREATE|DROP) (?:UNIQUE )?(?:TABLE|INDEX|TRIGGER) (?:IF (?:NOT )?EXISTS )?(\w+)",
            file.read_text(),
        ):
            (created.add if verb == "CREATE" else created.discard)(made)
    assert {"agent_sessions", "agent_messages", "agent_sessions_by_name"} <= created
    assert {row["name"] for row in schema} == created
    # ...and exactly the schema the stores apply from the same files (stores/_schema.py).
    fresh = sqlite3.connect(":memory:")
    for statement in _schema.schema_plan({}):
        fresh.execute(statement)
    with contextlib.closing(sqlite3.connect(dev.d1_file(state, DATABASE))) as migrated:
        assert _objects(migrated) == _objects(fresh)
    fresh.close()
    with pytest.raises(SystemExit, match="seq must directly follow"):  # the trigger still holds
        d1(
            "INSERT INTO agent_messages (session_id, seq, role, content, created_at) "
            f"VALUES ('{OLD}', 3, 'user', 'gap', 3000)"
        )

    # The Worker (the triage example, offline; src/agent.py is the user's) on that state.
    none = tmp_path / "no.dev.vars"
    triage = PROJECT / "examples" / "triage" / "agent.py"
    args = ["--persist-to", str(state), "--dev-vars", str(none), "--agent", str(triage)]
    with dev_process.DevServer(args) as server:
        # Its D1 is the database wrangler migrated: nothing left to apply.
        assert "D1 migrations: up to date" in server.output, server.output
        url = server.url

        # Found by its name (its object's id is the old row's id), its history as written.
        status, old = call(url, "GET", "/sessions/old-session")
        assert status == 200, old
        assert old["session_id"] == OLD
        assert [(m["role"], m["content"]) for m in old["messages"]] == [
            ("user", "q"),
            ("assistant", "a"),
        ]
        # A turn on the old session appends after its rows, on the migrated schema.
        status, turn = call(url, "POST", "/sessions/old-session/messages", {"message": "hello"})
        assert (status, turn["status"], turn["session_id"]) == (200, "complete", OLD), turn
        status, made = call(url, "POST", "/sessions/new-session/messages", {"message": "hello"})
        assert (status, made["status"]) == (200, "complete"), made
        new = made["session_id"]
        assert new == local_object_id(UNIQUE_KEY, "new-session")

        # What the Worker wrote, read by wrangler (another workerd) while it runs.
        rows = d1(
            "SELECT session_id, seq, role FROM agent_messages "
            f"WHERE session_id IN ('{OLD}', '{new}') ORDER BY session_id = '{OLD}' DESC, seq"
        )
        assert [(r["session_id"], r["seq"], r["role"]) for r in rows] == [
            (OLD, 0, "user"), (OLD, 1, "assistant"), (OLD, 2, "user"), (OLD, 3, "assistant"),
            (new, 0, "user"), (new, 1, "assistant"),
        ]  # fmt: skip

        # Listed newest first, a page at a time; the old session with its name and tokens.
        status, first = call(url, "GET", "/sessions?limit=1")
        assert status == 200, first
        assert [s["session_id"] for s in first["sessions"]] == [new]
        assert first["next_cursor"] is not None
        status, second = call(url, "GET", f"/sessions?limit=1&cursor={first['next_cursor']}")
        assert status == 200, second
        [listed] = second["sessions"]
        assert (listed["session_id"], listed["name"], listed["message_count"]) == (OLD, OLD, 4)
        assert listed["usage"]["input_tokens"] >= 12
        assert listed["usage"]["output_tokens"] >= 5
        assert second["next_cursor"] is None
        status, both = call(url, "GET", "/sessions")
        assert [s["session_id"] for s in both["sessions"]] == [new, OLD], both
