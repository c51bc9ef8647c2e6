"""`scripts/dev` starts the kit's Worker from a dedicated memory snapshot of the kit's
imports (runtime/dev_snapshot.py, issue 33 item 3), and nothing of what it serves changes.

Over HTTP, one server for the module (two starts when no snapshot is cached yet: the first
saves one in the background, the second starts from it): a probe agent answers whether
the Worker was restored from a dedicated snapshot (workerd's `_cf_internal_snapshot_info`);
an edit of the agent file reloads from the same snapshot and serves the edit; an agent
drawing randomness at its top level is still refused, as on deploy, and named to each
request. On CPython: the key follows the staged kit and python_modules/'s stamp (not the
agent), the staged main preloads the entry's imports but the agent's, and a kit edit takes
the snapshot away from the next reloads and undoing it brings it back.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import runtime_module
from tests.support.worker_fakes import PROJECT, DevServer

PROBE_AGENT = '''
"""Answers whether the Worker was restored from a dedicated memory snapshot."""

import json

from durable_agents import Agent, LLMResponse
from durable_agents.llm.offline import FunctionLLM

VERSION = "first"
AGENT = Agent("snapshot-probe", "Say how the Worker started.")


def make_deps(env, http):
    return None


def make_llm(env):
    def answer(messages, tools):
        import _cf_internal_snapshot_info as info

        dedicated = bool(info.loadedSnapshot) and not info.loadedBaselineSnapshot
        return LLMResponse(json.dumps({"version": VERSION, "dedicated": dedicated}))

    return FunctionLLM(answer)
'''
USED = "dev: the Worker starts from a memory snapshot of the kit's imports"


dev_snapshot = runtime_module("dev_snapshot")
dev_limits = runtime_module("dev_limits")


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    file = tmp_path_factory.mktemp("snapshot-agent") / "probe_agent.py"
    file.write_text(PROBE_AGENT)
    return file


@pytest.fixture(scope="module")
def server(agent_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    state = tmp_path_factory.mktemp("snapshot-state")
    dev = DevServer(state, {"API_TOKEN": "test-token"}, agent=agent_file).start()
    try:
        if not any(line.startswith(USED) for line in dev.lines):
            # None cached yet: this start saves one once ready; the next starts from it.
            dev.wait_for_line(r"^dev: saved a memory snapshot", timeout=180)
            dev.worker.restart()
        yield dev
    finally:
        dev.kill_all()


def ask(server: DevServer, session: str) -> Any:
    status, _, reply = server.request(
        "POST", f"/sessions/{session}/messages", json.dumps({"message": "hi"}).encode()
    )
    return status, reply


def served(server: DevServer, wanted: str, limit: float = 90) -> Any:
    """The first answer of the version `wanted`, polling (a reload takes seconds)."""
    started = time.monotonic()
    polls = 0
    while time.monotonic() - started < limit:
        polls += 1
        with contextlib.suppress(OSError, ValueError):
            status, reply = ask(server, f"poll-{wanted}-{polls}")
            if status == 200 and json.loads(reply["response"])["version"] == wanted:
                return json.loads(reply["response"])
        time.sleep(0.1)
    raise AssertionError(f"{wanted!r} was not served within {limit:.0f} s:\n{server.lines}")


@pytest.mark.slow
def test_the_worker_starts_and_reloads_from_the_snapshot_and_serves_as_before(
    server: DevServer, agent_file: Path
) -> None:
    assert any(line.startswith(USED) for line in server.lines), server.lines
    starts = sum(line.startswith("dev: ready on") for line in server.lines)
    status, reply = ask(server, "first")
    assert status == 200, reply
    assert json.loads(reply["response"]) == {"version": "first", "dedicated": True}

    # Randomness at the agent's top level: refused at the Worker's start, as on deploy.
    agent_file.write_text(PROBE_AGENT + '\n_DRAWN = __import__("random").random()\n')
    started = time.monotonic()
    status, reply = 200, {}
    while status != 500 and time.monotonic() - started < 90:  # 503: mid-reload
        with contextlib.suppress(OSError):
            status, reply = ask(server, f"entropy-{time.monotonic_ns()}")
        time.sleep(0.1)
    assert status == 500, reply
    assert reply["error"]["code"] == "agent-not-loaded"
    assert "Cannot use random.random() outside of request context" in reply["error"]["message"]

    agent_file.write_text(PROBE_AGENT.replace('VERSION = "first"', 'VERSION = "second"'))
    assert served(server, "second") == {"version": "second", "dedicated": True}
    assert sum(line.startswith("dev: ready on") for line in server.lines) == starts  # reloads


# --- on CPython: the key, the preloaded modules, a kit edit mid-session ---


def _staged(root: Path) -> tuple[Path, Path]:
    built, extra = root / "built", root / "extra"
    (built / "durable_agents").mkdir(parents=True)
    extra.mkdir()
    (built / "durable_agents" / "__init__.py").write_text("")
    (built / "entry.py").write_text("import agent\n")
    (built / "agent.py").write_text("A = 1\n")
    (extra / "_workers_plan_main.py").write_text("")
    return built, extra


def test_the_key_follows_the_kit_and_python_modules_not_the_agent(tmp_path: Path) -> None:
    built, extra = _staged(tmp_path)
    stamp = tmp_path / ".vendor-stamp"
    workerd = tmp_path / "workerd"
    workerd.write_text("binary")

    def key() -> str | None:
        files = dev_snapshot.kit_files(built, extra)
        return dev_snapshot.snapshot_key(files, tmp_path, stamp, workerd, {"date": "2026-09-08"})

    assert key() is None  # python_modules/ without a stamp: no snapshot
    stamp.write_text("one")
    first = key()
    (built / "agent.py").write_text("A = 2\n")
    assert key() == first
    (built / "durable_agents" / "__init__.py").write_text("X = 1\n")
    assert key() not in (None, first)
    (built / "durable_agents" / "__init__.py").write_text("")
    stamp.write_text("two")
    assert key() not in (None, first)


def test_the_entrys_imports_but_the_agents_are_preloaded() -> None:
    preload = dev_snapshot.preload(PROJECT / "src" / "entry.py")
    assert "workers" in preload
    assert "durable_agents.cloudflare.app" in preload
    assert not {"agent", "__future__", "_durable_agents_dev"} & set(preload)
    main = dev_limits.generated_main("entry", dev_limits.PLANS["free"], preload)
    compile(main, "_workers_plan_main.py", "exec")
    assert "import agent" not in main


def test_a_kit_edit_takes_the_snapshot_from_the_next_reloads_undoing_it_gives_it_back(
    tmp_path: Path,
) -> None:
    built, _ = _staged(tmp_path)
    cache, folder = tmp_path / "cache", tmp_path / "stage" / "snapshot"
    cache.mkdir()
    edit = built / "durable_agents" / "__init__.py"

    def key() -> str:
        return str(hash(edit.read_text()) & 0xFFFF)

    snapshot = dev_snapshot.Snapshot(cache, folder, key)
    (cache / f"{snapshot.loaded}.bin").write_bytes(b"memory")
    assert snapshot.use()
    assert (folder / dev_snapshot.FILE).read_bytes() == b"memory"
    assert snapshot.env()["DURABLE_AGENTS_PYODIDE_SNAPSHOT_DIR"] == str(folder)
    edit.write_text("X = 1\n")
    snapshot.check()
    assert not (folder / dev_snapshot.FILE).exists()
    edit.write_text("")
    snapshot.check()
    assert (folder / dev_snapshot.FILE).read_bytes() == b"memory"
