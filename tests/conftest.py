from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import pytest
from runtime.kit_files import is_kit

from durable_agents.cloudflare import d1_store
from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.testing.conformance import ticking_clock
from durable_agents.testing.fake_d1 import FakeD1Database
from durable_agents.testing.pytest_plugin import dev_worker  # noqa: F401 - the Worker harness

# About how many seconds each slow test file takes in one xdist process on an idle 2-core
# machine (scripts/test's --durations and a junit report, summed per file); every file not
# named here takes a few seconds or less. Only the order matters: see
# pytest_collection_modifyitems.
SLOW_FILES: Mapping[str, int] = {
    "tests/cloudflare/test_wrangler_migrations.py": 87,
    "tests/cloudflare/test_worker_harness.py": 78,
    "tests/test_cli.py": 75,
    "tests/cloudflare/test_dev_server_operating.py": 72,
    "tests/cloudflare/test_dev_server_streaming_turns.py": 71,
    "tests/cloudflare/test_docs_walkthrough.py": 68,
    "tests/cloudflare/test_dev_server_do_store.py": 54,
    "tests/cloudflare/test_chat_page.py": 60,
    "tests/cloudflare/test_dev_server.py": 49,
    "tests/cloudflare/test_dev_server_fresh_state.py": 46,
    "tests/cloudflare/test_dev_server_big_steps.py": 45,
    "tests/cloudflare/test_dev_server_alarms.py": 56,
    "tests/cloudflare/test_dev_server_approvals.py": 42,
    "tests/cloudflare/test_dev_server_mcp.py": 39,
    "tests/cloudflare/test_dev_server_turn_features.py": 38,
    "tests/llm/test_llm_crash_sweep.py": 37,
    "tests/cloudflare/test_other_workers.py": 30,
    "tests/test_worker.py": 42,
    "tests/test_process_concurrency.py": 29,
    "tests/test_user_code_checks.py": 27,
    "tests/cloudflare/test_dev_server_long_session.py": 27,
    "tests/test_docs.py": 27,
    "tests/cloudflare/test_dev_server_settings.py": 45,
    "tests/runtime/test_check_agent_d1.py": 26,
    "tests/runtime/test_alarm_sweep.py": 26,
    "tests/test_bundle.py": 35,
    "tests/cloudflare/test_dev_server_toolset_down.py": 24,
    "tests/cloudflare/test_dev_server_limits.py": 23,
    "tests/cloudflare/test_dev_server_streaming.py": 22,
    "tests/cloudflare/test_dev_server_hostile.py": 20,
    "tests/test_process_crash.py": 18,
    "tests/cloudflare/test_dev_server_failures.py": 18,
    "tests/cloudflare/test_dev_server_nesting.py": 15,
    "tests/cloudflare/test_dev_server_model_hostile.py": 14,
    "tests/cloudflare/test_dev_server_agents.py": 25,
    "tests/cloudflare/test_dev_server_several_agents.py": 12,
    "tests/cloudflare/test_dev_server_agent_tools.py": 26,
    "tests/test_check_agent.py": 14,
    "tests/runtime/test_d1_store.py": 13,
    "tests/test_add_package.py": 12,
    "tests/test_compaction.py": 12,
    "tests/runtime/test_recurrence.py": 12,
    "tests/runtime/test_crash_sweep_d1.py": 10,
    "tests/cloudflare/test_output_gate.py": 9,
    "tests/test_crash_sweep.py": 9,
    "tests/test_postgres_store.py": 9,
    "examples/triage/test_demo.py": 8,
    "tests/test_mcp.py": 8,
    "tests/test_public_api.py": 8,
    "tests/test_check_agent_mcp.py": 7,
}


def pytest_configure(config: pytest.Config) -> None:
    """With a bytecode prefix (scripts/test's PYTHONPYCACHEPREFIX, outside src/), bytecode is
    written there, by this process and every process the tests start (xdist's, each CLI
    run, each crashed child, each MCP server): a prefix hides .venv's own __pycache__, so
    under a shell's PYTHONDONTWRITEBYTECODE each of them would compile the kit and its
    dependencies from source (2-4 s a process). Without a prefix nothing changes: no
    __pycache__ may appear in src/, which `wrangler dev` watches."""
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        sys.dont_write_bytecode = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest test files first, each file's tests kept together and in their order.

    `scripts/test` runs `pytest -n N --dist loadfile --no-loadscope-reorder`: xdist hands
    whole files to its processes in this order, the next one to whichever is free.
    Longest first leaves the short files for the end, where they even the processes
    out; in collection order (or xdist's own, most tests first) a file of one long test
    could start last and keep one process running alone for a minute."""

    def weight(item: pytest.Item) -> int:
        relative = item.path.relative_to(config.rootpath).as_posix()
        return SLOW_FILES.get(relative, 0)

    items.sort(key=weight, reverse=True)  # stable: the rest stay in collection order


async def _make(kind: str, tmp_path: Path) -> tuple[Store, object]:
    if kind == "memory":
        return memory_store(clock=ticking_clock()), None
    if kind == "sqlite":
        store = sqlite_store(tmp_path / "store.db", clock=ticking_clock())
        return store, store
    database = FakeD1Database(str(tmp_path / "d1.db"))
    d1 = d1_store(database, clock=ticking_clock())
    await d1.create_tables()
    return d1, database


async def _close(resource: object) -> None:
    if isinstance(resource, FakeD1Database):
        resource.close()
    elif resource is not None:
        await resource.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "d1-fake", "memory"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every backend that runs on CPython, fresh and empty. (D1 on the real engine:
    tests/runtime/.)"""
    store, resource = await _make(request.param, tmp_path)
    yield store
    await _close(resource)


@pytest.fixture(params=["sqlite", "d1-fake"])
async def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every durable backend that runs on CPython, fresh and empty."""
    store, resource = await _make(request.param, tmp_path)
    yield store
    await _close(resource)


TEMPLATE_VARS = Path(__file__).parent / "support" / "template_vars.toml"


@pytest.fixture(autouse=True, scope="module")
def template_vars(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every dev server a test of the kit starts serves the template's [vars] (runtime/dev.py:
    DURABLE_AGENTS_VARS), not what a user has put in wrangler.toml's: the kit's tests hold
    whatever agent and settings the project has. Your own tests' servers serve yours."""
    relative = Path(str(request.path)).resolve().relative_to(Path(__file__).parent.parent)
    with pytest.MonkeyPatch.context() as env:
        if is_kit(relative.as_posix()):
            env.setenv("DURABLE_AGENTS_VARS", str(TEMPLATE_VARS))
        yield


@pytest.fixture(autouse=True, scope="module")
def agent_module_kept() -> Iterator[None]:
    """The module `agent` is what it was before each test file: the tooling loads an agent
    file as `agent`, as the Worker names it (runtime/agent_checks.py), and one file's test
    agent must not become another's (tests/test_agent.py imports the template's)."""
    kept = sys.modules.get("agent")
    yield
    if kept is None:
        sys.modules.pop("agent", None)
    else:
        sys.modules["agent"] = kept
