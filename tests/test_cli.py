"""The `durable-agents` command, run as a real process, on a store a crashed run left."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from tests.support.delegated_sessions import CALL, CHILD, PARENT, store_delegated_sessions
from tests.support.worker_fakes import (
    PROJECT,
    START_TIMEOUT_S,
    TRIAGE_AGENT,
    FakeServices,
    durable_object_id,
)

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    Usage,
    approval_digest,
    approve,
    run,
    schedule,
    stop_turn,
    tool,
)
from durable_agents.stores import sqlite_store
from durable_agents.stores.base import ApprovalChange
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_on_write
from durable_agents.testing.conformance import ticking_clock
from durable_agents.testing.worker import DevWorker

SESSION = "cli-session-1"
NAME = "ops-send"
HOSTILE_NAME = "red\x1b[31m<script>\u202e"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class Target(BaseModel):
    to: str


@tool
async def send(args: Target) -> dict[str, bool]:
    """Send something (a side effect)."""
    return {"sent": True}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session whose send's result was lost in a crash, then resumed; then four
    more sessions (two of them under one name), created a second apart."""

    async def make(path: Path) -> None:
        agent = Agent("cli-test", "Send when asked.", [send])
        llm = ScriptedLLM([
            LLMResponse("Sending.", [ToolCall("c1", "send", {"to": "ops"})], Usage(120, 8)),
            LLMResponse("It may have been sent; please check.", usage=Usage(150, 12)),
            *[LLMResponse(f"hello {i}", usage=Usage(10, 1)) for i in range(4)],
        ])  # fmt: skip
        store = sqlite_store(path, clock=ticking_clock())
        try:
            with pytest.raises(SimulatedCrash):
                await run(agent, llm=llm, message="send it", session_id=SESSION,
                          session_name=NAME, store=crash_on_write(store, 2))  # fmt: skip
            await run(agent, llm=llm, session_id=SESSION, store=store)
            for session_id, name in [("dup-1", "dup"), ("dup-2", "dup"),
                                     ("plain", "plain"), ("ansi", HOSTILE_NAME)]:  # fmt: skip
                await run(agent, llm=llm, message="hi", session_id=session_id,
                          session_name=name, store=store)  # fmt: skip
        finally:
            await store.close()

    path = tmp_path_factory.mktemp("cli") / "agents.db"
    asyncio.run(make(path))
    return path


def test_sessions_list_and_show(db: Path) -> None:
    listed = cli("sessions", "list", "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    assert SESSION in listed.stdout
    assert "cli-test" in listed.stdout
    assert "idle" in listed.stdout
    shown = cli("sessions", "show", SESSION, "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "send result = tool-durability-error (not re-invoked)" in shown.stdout
    as_json = cli("sessions", "show", SESSION, "--db", str(db), "--json")
    assert as_json.returncode == 0
    messages = json.loads(as_json.stdout)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(messages[2]["content"])["kind"] == "tool-durability-error"


def test_unknown_session_and_missing_db_are_clear_errors(db: Path, tmp_path: Path) -> None:
    unknown = cli("sessions", "show", "nope", "--db", str(db))
    assert unknown.returncode == 1
    assert "no session 'nope'" in unknown.stderr
    missing = cli("sessions", "list", "--db", str(tmp_path / "absent.db"))
    assert missing.returncode == 2
    assert "no database" in missing.stderr
    assert not (tmp_path / "absent.db").exists()


def test_the_command_knows_no_example() -> None:
    helped = cli("--help")
    assert helped.returncode == 0
    assert "sessions" in helped.stdout
    assert "demo" not in helped.stdout
    assert cli("demo").returncode == 2


def test_list_pages_with_a_cursor(db: Path) -> None:
    seen: list[str] = []
    cursor: list[str] = []
    for _ in range(5):
        page = cli("sessions", "list", "--db", str(db), "--limit", "2", "--json", *cursor)
        assert page.returncode == 0, page.stderr
        data = json.loads(page.stdout)
        seen += [s["session_id"] for s in data["sessions"]]
        if data["next_cursor"] is None:
            break
        cursor = ["--cursor", data["next_cursor"]]
    # newest created first, each once
    assert seen == ["ansi", "plain", "dup-2", "dup-1", SESSION]
    text = cli("sessions", "list", "--db", str(db), "--limit", "2")
    lines = text.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "session", "id"]
    assert lines[-1].startswith("next cursor: ")
    after = cli("sessions", "list", "--db", str(db), "--limit", "2",
                "--cursor", lines[-1].split()[2])  # fmt: skip
    assert [line.split()[1] for line in after.stdout.splitlines()[1:3]] == ["dup-2", "dup-1"]


def test_list_shows_names_usage_and_times(db: Path) -> None:
    data = json.loads(cli("sessions", "list", "--db", str(db), "--json").stdout)
    (first,) = [s for s in data["sessions"] if s["session_id"] == SESSION]
    assert first["name"] == NAME
    assert first["agent"] == "cli-test"
    assert first["message_count"] == 4
    assert first["usage"] == {"input_tokens": 270, "output_tokens": 20}
    assert first["created_at"] < first["updated_at"]
    assert data["next_cursor"] is None
    listed = cli("sessions", "list", "--db", str(db)).stdout
    (row,) = [line for line in listed.splitlines() if f" {SESSION} " in line]
    assert row.split()[:4] == [NAME, SESSION, "cli-test", "idle"]
    assert "270/20" in row
    assert re.search(r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d", row)


def test_stored_text_never_drives_the_terminal(db: Path) -> None:
    listed = cli("sessions", "list", "--db", str(db))
    assert "\x1b" not in listed.stdout
    assert "\u202e" not in listed.stdout
    assert "red\\x1b[31m<script>\\u202e" in listed.stdout


def test_show_by_name_the_newest_of_several(db: Path) -> None:
    by_name = cli("sessions", "show", NAME, "--db", str(db))
    assert by_name.returncode == 0, by_name.stderr
    assert f"id       {SESSION}" in by_name.stdout
    assert "send result = tool-durability-error (not re-invoked)" in by_name.stdout
    assert by_name.stderr == ""
    dup = cli("sessions", "show", "dup", "--db", str(db), "--json")
    assert dup.returncode == 0
    assert json.loads(dup.stdout)["session_id"] == "dup-2"
    assert "2 sessions are named 'dup'; showing the newest (dup-2); the others: dup-1" in (
        dup.stderr
    )


def test_show_writes_the_timeline_page(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.html"
    written = cli("sessions", "show", NAME, "--db", str(db), "--html", str(out))
    assert written.returncode == 0, written.stderr
    assert f"wrote {out}" in written.stdout
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>")
    assert 'data-kind="tool-durability-error"' in page
    assert "Repaired after a crash" in page
    assert f"<h1>{NAME}</h1>" in page
    assert "<script" not in page
    to_stdout = cli("sessions", "show", SESSION, "--db", str(db), "--html", "-")
    assert to_stdout.stdout == page
    hostile = cli("sessions", "show", "ansi", "--db", str(db), "--html", "-").stdout
    assert "<script" not in hostile
    assert "&lt;script&gt;" in hostile


def test_bad_cursor_and_no_source_are_clear_errors(db: Path, tmp_path: Path) -> None:
    bad = cli("sessions", "list", "--db", str(db), "--cursor", "not-a-cursor")
    assert bad.returncode == 2
    assert "not a cursor this store handed out" in bad.stderr
    assert cli("sessions", "list", "--db", str(db), "--limit", "0").returncode == 2
    nowhere = subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", "sessions", "list"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert nowhere.returncode == 2
    assert "--db PATH" in nowhere.stderr
    assert "--d1 DIR" in nowhere.stderr
    no_state = cli("sessions", "list", "--d1", str(tmp_path))
    assert no_state.returncode == 2
    assert "no D1 database with sessions under" in no_state.stderr


# -- the dev server's local D1 -----------------------------------------------------------------


@pytest.fixture(scope="module")
def dev_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevWorker, Path]]:
    """scripts/dev serving the triage example (its model and services faked), two
    sessions written through it: `alpha` (two turns) and `beta`."""
    state = tmp_path_factory.mktemp("cli-d1") / "state"
    with FakeServices() as services:
        dev = DevWorker(PROJECT, state, settings=services.worker_env(), agent=TRIAGE_AGENT,
                        start_timeout=START_TIMEOUT_S)  # fmt: skip
        with dev:
            for name, text in [("alpha", "triage issue 7"), ("beta", "triage issue 8"),
                               ("alpha", "and issue 9")]:  # fmt: skip
                answer = dev.post(f"/sessions/{name}/messages", {"message": text})
                assert answer.status == 200, answer.text
                assert answer.body["status"] == "complete"
            yield dev, state


@pytest.mark.slow
def test_sessions_of_the_dev_servers_d1(dev_state: tuple[DevWorker, Path], tmp_path: Path) -> None:
    dev, state = dev_state
    alpha, beta = durable_object_id("alpha"), durable_object_id("beta")
    assert re.fullmatch(r"[0-9a-f]{64}", alpha)
    # While the server runs: read-only, beside it.
    listed = cli("sessions", "list", "--d1", str(state))
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [r[:4] for r in rows] == [["beta", beta, "triage", "idle"],
                                     ["alpha", alpha, "triage", "idle"]]  # fmt: skip
    data = json.loads(cli("sessions", "list", "--d1", str(state), "--json", "--limit", "1").stdout)
    assert [s["session_id"] for s in data["sessions"]] == [beta]
    after = cli("sessions", "list", "--d1", str(state), "--json", "--cursor", data["next_cursor"])
    (listed_alpha,) = json.loads(after.stdout)["sessions"]
    assert listed_alpha["name"] == "alpha"
    assert listed_alpha["message_count"] == len(dev.get("/sessions/alpha").body["messages"])
    assert listed_alpha["usage"]["input_tokens"] > 0

    out = tmp_path / "alpha.html"
    shown = cli("sessions", "show", "alpha", "--d1", str(state), "--html", str(out))
    assert shown.returncode == 0, shown.stderr
    page = out.read_text(encoding="utf-8")
    assert alpha in page
    assert page.count('<section class="turn"') == 2
    by_id = cli("sessions", "show", alpha, "--d1", str(state), "--json")
    assert [m["role"] for m in json.loads(by_id.stdout)["messages"]] == [
        m["role"] for m in dev.get("/sessions/alpha").body["messages"]
    ]
    # The database file itself, and after the server stopped.
    (database,) = (state / "v3" / "d1" / "miniflare-D1DatabaseObject").glob("[0-9a-f]*.sqlite")
    assert cli("sessions", "show", "beta", "--d1", str(database)).returncode == 0
    dev.stop()
    stopped = cli("sessions", "list", "--d1", str(state))
    assert stopped.returncode == 0, stopped.stderr
    assert alpha in stopped.stdout


@tool(requires_approval=True)
async def refund(args: Target) -> dict[str, bool]:
    """Refund someone (needs a person's approval)."""
    return {"refunded": True}


def test_show_names_a_call_waiting_for_approval(tmp_path: Path) -> None:
    async def make(path: Path) -> None:
        agent = Agent("refunds", "Refund when asked.", [refund])
        llm = ScriptedLLM([LLMResponse("", [ToolCall("r1", "refund", {"to": "ann"})])])
        async with sqlite_store(path) as store:
            waiting = await run(agent, llm=llm, message="refund ann", session_id="r", store=store)
            assert waiting.status == "awaiting_approval"

    db = tmp_path / "refunds.db"
    asyncio.run(make(db))
    shown = cli("sessions", "show", "r", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        r"waiting for approval: refund \(call r1, digest [0-9a-f]{12}…\)", shown.stdout
    )
    page = cli("sessions", "show", "r", "--db", str(db), "--html", "-").stdout
    assert 'data-kind="pending-approval"' in page


def test_show_marks_scheduled_self_resumed_and_stopped_turns(tmp_path: Path) -> None:
    async def make(path: Path) -> None:
        agent = Agent("cli-test", "Send when asked.", [send])
        async with sqlite_store(path) as store:
            await run(agent, llm=ScriptedLLM([LLMResponse("Hi.")]), message="hi",
                      session_id="m", store=store)  # fmt: skip
            reminder = await schedule(store, "m", "Send the reminder", delay_seconds=0)
            await run(agent, llm=ScriptedLLM([LLMResponse("Sent.")]), message=reminder.message,
                      request_key=reminder.request_key, origin="scheduled", session_id="m",
                      store=store)  # fmt: skip
            tick = await schedule(store, "m", "Tick", every_seconds=60)
            await run(agent, llm=ScriptedLLM([LLMResponse("Ticked.")]), message=tick.message,
                      request_key=tick.request_key, origin="scheduled", session_id="m",
                      store=store)  # fmt: skip
            llm = ScriptedLLM([LLMResponse("", [ToolCall("s1", "send", {"to": "ops"})])])
            with pytest.raises(SimulatedCrash):
                await run(agent, llm=llm, message="send it", session_id="m",
                          store=crash_on_write(store, 1, when="after"))  # fmt: skip
            await stop_turn(agent, store=store, session_id="m", reason="It kept crashing.")

    db = tmp_path / "marks.db"
    asyncio.run(make(db))
    shown = cli("sessions", "show", "m", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    # A scheduled turn's message names its schedule; a recurring one's, the occurrence too.
    once = r'\[scheduled: schedule sch_\w+\] user "Send the reminder"'
    assert any(re.search(once, line) for line in lines), lines
    every = r'\[scheduled: recurring schedule sch_\w+, occurrence due [0-9T:.-]+Z\] user "Tick"'
    assert any(re.search(every, line) for line in lines), lines
    assert any(re.search(r'\[scheduled\] assistant "Sent\."', line) for line in lines)
    assert any(re.search(r"\[stopped\] assistant \"It kept crashing\.\"", line) for line in lines)
    assert any("send result = tool-durability-error" in line for line in lines)
    assert re.search(r"state stopped", shown.stdout)


def test_show_lists_approval_decisions(tmp_path: Path) -> None:
    async def make(path: Path) -> None:
        agent = Agent("refunds", "Refund when asked.", [refund])
        calls = [ToolCall("r1", "refund", {"to": "ann"}), ToolCall("r2", "refund", {"to": "bo"})]
        llm = ScriptedLLM([LLMResponse("", calls), LLMResponse("One refunded, one not.")])
        async with sqlite_store(path, clock=ticking_clock()) as store:
            waiting = await run(agent, llm=llm, message="refund both", session_id="d", store=store)
            digests = {p.tool_call_id: p.digest for p in waiting.pending}
            await approve(store, "d", "r1", digest=digests["r1"], approved=True)
            await approve(
                store, "d", "r2", digest=digests["r2"], approved=False, reason="not \x1b[31mtheirs"
            )
            done = await run(agent, llm=llm, session_id="d", store=store)
            assert done.status == "complete"

    db = tmp_path / "decisions.db"
    asyncio.run(make(db))
    shown = cli("sessions", "show", "d", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    after = shown.stdout.split("\napprovals\n", 1)[1].splitlines()
    events = [line.strip().split("  ", 1)[1] for line in after if line.startswith("      ")]
    assert events[:2] == [
        f"refund (call r1) needs approval (digest {digests_of(db)['r1'][:12]}…)",
        f"refund (call r2) needs approval (digest {digests_of(db)['r2'][:12]}…)",
    ]
    assert "refund (call r1) approved" in events
    assert "refund (call r2) denied: not \\x1b[31mtheirs" in events  # escaped, never raw
    assert "refund (call r1) started (claimed: its handler runs once)" in events
    as_json = json.loads(cli("sessions", "show", "d", "--db", str(db), "--json").stdout)
    decided = {(a["tool_call_id"], a["event"]) for a in as_json["approvals"]}
    assert {("r1", "approved"), ("r2", "denied"), ("r1", "claimed")} <= decided


def test_show_gives_an_edited_approval_both_versions_and_the_turns_instructions(
    tmp_path: Path,
) -> None:
    """Written as a turn leaves them: a user message with the instructions it was sent, the
    call waiting (write #1), then a person's approval with an edit (`approve`)."""
    agent = Agent("refunds", "Refund when asked.", [refund])
    call = ToolCall("r1", "refund", {"to": "ann"})
    digest = approval_digest("e", "r1", "refund", call.arguments)

    async def make(path: Path) -> None:
        async with sqlite_store(path, clock=ticking_clock()) as store:
            sent = Message("user", "refund ann", instructions="Refund at most 20 €. \x1b[31m")
            await store.append_messages_atomic(
                "e", 0, [sent, Message.assistant("", [call])],
                approvals=[ApprovalChange("r1", "requested", digest, tool_name="refund")],
            )  # fmt: skip
            await approve(store, "e", "r1", digest=digest, approved=True, reason="ann: to bo",
                          arguments={"to": "bo"}, agent=agent)  # fmt: skip

    db = tmp_path / "edits.db"
    asyncio.run(make(db))
    shown = cli("sessions", "show", "e", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any('user "refund ann" (instructions "Refund at most 20 €. \\x1b[31m")' in line
               for line in lines), lines  # fmt: skip
    at = next(i for i, line in enumerate(lines) if "approved" in line)
    assert lines[at].endswith("refund (call r1) approved, arguments edited: ann: to bo")
    assert lines[at + 1].split() == ["the", "model's", '{"to":', '"ann"}']
    assert lines[at + 2].split() == ["runs", "with", '{"to":', '"bo"}']
    as_json = json.loads(cli("sessions", "show", "e", "--db", str(db), "--json").stdout)
    assert as_json["messages"][0]["instructions"] == "Refund at most 20 €. \x1b[31m"
    assert "instructions" not in as_json["messages"][1]
    requested, approved = as_json["approvals"]
    assert (requested["arguments"], requested["arguments_digest"]) == (None, None)
    assert "model_arguments" not in requested
    assert approved["arguments"] == {"to": "bo"}
    assert approved["model_arguments"] == {"to": "ann"}
    assert approved["arguments_digest"] == approval_digest("e", "r1", "refund", {"to": "bo"})
    assert approved["digest"] == digest
    page = cli("sessions", "show", "e", "--db", str(db), "--html", "-").stdout
    assert 'data-edited="true"' in page
    assert '<details class="instructions"' in page


def digests_of(db: Path) -> dict[str, str]:
    async def read() -> dict[str, str]:
        async with sqlite_store(db) as store:
            events = await store.load_approvals("d")
        return {e.tool_call_id: e.digest for e in events if e.event == "requested"}

    return asyncio.run(read())


def test_show_links_a_parent_call_and_its_child_session_both_ways(tmp_path: Path) -> None:
    db = tmp_path / "delegated.db"
    asyncio.run(store_delegated_sessions(db))
    parent = cli("sessions", "show", PARENT, "--db", str(db))
    assert parent.returncode == 0, parent.stderr
    assert f"{CALL} -> child session {CHILD}" in parent.stdout
    assert "parent " not in parent.stdout
    child = cli("sessions", "show", CHILD, "--db", str(db))
    assert child.returncode == 0, child.stderr
    assert f"  parent   session {PARENT} (id {PARENT}), call {CALL}" in child.stdout
    assert re.search(r'\[agent-tool\] user "refund order 42"', child.stdout)
    # The child's own call ran no agent: no child session under it.
    assert "-> child session" not in child.stdout

    parent_json = json.loads(cli("sessions", "show", PARENT, "--db", str(db), "--json").stdout)
    assert parent_json["parent"] is None
    assert parent_json["children"] == [{"tool_call_id": CALL, "session_id": CHILD, "name": CHILD}]
    child_json = json.loads(cli("sessions", "show", CHILD, "--db", str(db), "--json").stdout)
    assert child_json["parent"] == {"session_id": PARENT, "name": PARENT, "tool_call_id": CALL}
    assert child_json["children"] == []

    # --html links each page to the other's file, as `show NAME --html NAME.html` writes it.
    for name in (PARENT, CHILD):
        out = tmp_path / f"{name}.html"
        written = cli("sessions", "show", name, "--db", str(db), "--html", str(out))
        assert written.returncode == 0, written.stderr
    parent_page = (tmp_path / f"{PARENT}.html").read_text(encoding="utf-8")
    assert f'class="child-link" href="{CHILD}.html"' in parent_page
    child_page = (tmp_path / f"{CHILD}.html").read_text(encoding="utf-8")
    assert f'class="parent-link" href="{PARENT}.html#call-{CALL}"' in child_page
