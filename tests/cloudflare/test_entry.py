"""src/entry.py stays a thin shell over the user's src/agent.py, and the library stays
importable on CPython.

Only src/entry.py imports the Workers runtime (`workers`, `js`, `pyodide`) at
module level; library modules touch it only inside functions. entry.py names
no agent, setting or tool: it imports the agent module (`agent`) and the kit.
Read with `ast`: entry.py itself imports `workers`, which exists only in the
runtime. Nothing here reads src/agent.py, which is the user's to replace.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agents.cloudflare import d1_store
from durable_agents.messages import Message
from durable_agents.testing.fake_d1 import FakeD1Database

SRC = Path(__file__).resolve().parents[2] / "src"
RUNTIME_MODULES = {"workers", "js", "pyodide"}


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_entry_is_a_thin_shell_over_the_agent_module() -> None:
    entry = SRC / "entry.py"
    assert len(entry.read_text().splitlines()) <= 200
    imports = _top_level_imports(entry)
    assert imports & RUNTIME_MODULES == {"workers"}
    assert imports <= {"__future__", "asyncio", "typing", "urllib", "workers", "agent",
                       "durable_agents"}, imports  # fmt: skip
    tree = ast.parse(entry.read_text())
    # `import agent`, in the function serve_agent calls (an agent that fails to import is
    # an error the Worker names, under the dev server)
    assert any(
        isinstance(node, ast.Import) and [a.name for a in node.names] == ["agent"]
        for node in ast.walk(tree)
    )
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert not {"AGENT", "make_deps", "make_llm", "SETTINGS", "DEV_STUBS"} & assigned
    literals = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [text for text in literals if "_URL" in text or "triage" in text.lower()]


def test_no_library_module_imports_the_runtime_at_module_level() -> None:
    offenders = {
        str(path.relative_to(SRC)): sorted(_top_level_imports(path) & RUNTIME_MODULES)
        for path in (SRC / "durable_agents").rglob("*.py")
        if _top_level_imports(path) & RUNTIME_MODULES
    }
    assert offenders == {}


def test_wrangler_toml_points_at_the_entry_and_its_classes() -> None:
    import tomllib

    config = tomllib.loads((SRC.parent / "wrangler.toml").read_text())
    # wrangler uploads every .py under main's folder: main is src/entry.py staged, with
    # only the modules it imports, by the [build] command (tests/test_bundle.py).
    assert config["main"] == "build/worker/entry.py"
    assert config["build"]["command"] == "python3 scripts/build_worker.py"
    assert set(config["compatibility_flags"]) == {
        "python_workers",
        "durable_object_io_tasks_prevent_eviction",  # a turn outlives its client
    }
    entry = ast.parse((SRC / "entry.py").read_text())
    classes = {node.name for node in entry.body if isinstance(node, ast.ClassDef)}
    bindings = config["durable_objects"]["bindings"]
    assert {b["class_name"] for b in bindings} <= classes
    assert config["migrations"][0]["new_sqlite_classes"] == [b["class_name"] for b in bindings]
    assert "Default" in classes
    (database,) = config["d1_databases"]
    assert (database["binding"], database["migrations_dir"]) == (
        "DB",
        "src/durable_agents/stores/migrations",
    )
    assert not {"API_TOKEN", "LLM_API_KEY"} & set(config["vars"]), "secrets do not go in [vars]"


class _Entrypoint:
    """The shape of the workers SDK's WorkerEntrypoint and DurableObject: (ctx, env)."""

    def __init__(self, ctx: Any, env: Any) -> None:
        self.ctx, self.env = ctx, env


@pytest.fixture
def entry_module() -> Iterator[types.ModuleType]:
    """src/entry.py imported on CPython: `workers` (which needs Pyodide's `js`) stood in by
    its three names entry.py uses; the kit and src/agent.py are the real ones."""
    workers = types.ModuleType("workers")
    workers.WorkerEntrypoint = _Entrypoint  # type: ignore[attr-defined]
    workers.DurableObject = _Entrypoint  # type: ignore[attr-defined]
    workers.Response = object  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("workers", "agent")}
    sys.modules["workers"] = workers
    sys.path.insert(0, str(SRC))
    try:
        spec = importlib.util.spec_from_file_location("entry_under_test", SRC / "entry.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SRC))
        for name, before in saved.items():
            if before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = before


async def test_the_cron_handler_takes_what_workerd_passes(
    entry_module: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    # workerd calls a WorkerEntrypoint's scheduled(controller, None, None) (measured by
    # test_workerd_behaviour.py); a handler of (self, controller) was a TypeError there,
    # so the retention cron never ran.
    db = FakeD1Database()
    now = time.time()
    old = d1_store(db, clock=lambda: now - 3 * 86400)
    await old.create_tables()
    await old.append_messages_atomic("idle", 0, [Message.user("long ago")])
    await d1_store(db).append_messages_atomic("fresh", 0, [Message.user("just now")])
    env = types.SimpleNamespace(DB=db, RETENTION_DAYS="2", SESSION_STORE="d1")
    worker = entry_module.Default(types.SimpleNamespace(), env)
    controller = types.SimpleNamespace(cron="17 * * * *", scheduledTime=now * 1000)
    await worker.scheduled(controller, None, None)
    assert await old.get_session("idle") is None
    assert await old.get_session("fresh") is not None
    assert "retention: deleted 1 idle session(s)" in capsys.readouterr().out
    await worker.scheduled(controller)  # a direct call (as a test makes) still works
    db.close()
