"""The public surface is the product's interface: changing it must be deliberate."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import durable_agents

PUBLIC = {
    "durable_agents": {
        "Agent", "tool", "Tool", "ToolContext", "run", "RunResult", "Message", "ToolCall",
        "ToolSpec", "LLMResponse", "Usage", "ToolDurabilityError", "MemoryStoreNotDurableError",
        "SessionConflictError", "SessionBusyError", "LLM", "ConfigurationError",
        "DurableAgentsError", "MalformedToolCall", "MessageTooLargeError", "SessionInfo",
        "SessionPage", "SessionNotFoundError",
        "RequestKeyReusedError", "InvalidCursorError", "ToolErrorKind", "ToolArgumentsError",
        "Store", "StoreError",
        "idempotency_key", "pending_tool_calls",
        "approve", "approval_digest", "pending_approvals", "PendingApproval", "ApprovalError",
        "ApprovalNotFoundError", "ApprovalDigestMismatchError", "ApprovalAlreadyDecidedError",
        "ApprovalPendingError",
        "CancelToken", "MessageStored", "RunEvent", "RunFinished", "StreamingLLM", "TextDelta",
        "ToolCallDelta", "Schedule", "ScheduleError", "schedule", "stop_turn",
        "ModelRetry", "RunContext", "Toolset", "ToolFailure", "ToolsetError",
        "agent_tool", "AgentRunner", "AgentTurn", "AgentTurnOutcome", "LocalAgent", "ChildEvent",
    },
    "durable_agents.stores": {
        "memory_store", "sqlite_store", "MemoryStore", "SQLiteStore", "SessionInfo", "Store",
        "Lease", "LeaseHolder", "ApprovalChange", "ApprovalEvent", "SessionPage",
        "Schedule", "postgres_store", "PostgresStore",
    },
    "durable_agents.testing": {
        "ScriptedLLM", "SimulatedCrash", "crash_on_write", "crash_after_tool_results",
        "CrashingStore", "LLMCall", "ScriptExhaustedError", "count_writes",
        "check_agent", "check_agent_async", "AgentCheckReport", "TestLLM", "FunctionLLM",
    },
}  # fmt: skip


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_all_is_exactly_the_public_surface(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == PUBLIC[module_name]
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_every_error_has_a_stable_code_under_one_root() -> None:
    errors = [
        durable_agents.ConfigurationError,
        durable_agents.MemoryStoreNotDurableError,
        durable_agents.SessionConflictError,
        durable_agents.SessionBusyError,
        durable_agents.StoreError,
        durable_agents.MessageTooLargeError,
        durable_agents.ToolDurabilityError,
        durable_agents.SessionNotFoundError,
        durable_agents.RequestKeyReusedError,
        durable_agents.InvalidCursorError,
        durable_agents.ToolArgumentsError,
        durable_agents.ApprovalError,
        durable_agents.ApprovalNotFoundError,
        durable_agents.ApprovalDigestMismatchError,
        durable_agents.ApprovalAlreadyDecidedError,
        durable_agents.ApprovalPendingError,
        durable_agents.ScheduleError,
    ]
    codes = [error.code for error in errors]
    assert len(set(codes)) == len(codes)
    assert all(issubclass(error, durable_agents.DurableAgentsError) for error in errors)
    assert issubclass(durable_agents.ConfigurationError, ValueError)
    assert issubclass(durable_agents.ToolArgumentsError, ValueError)


def test_crash_and_script_exhaustion_cannot_be_swallowed_by_except_exception() -> None:
    from durable_agents.testing import ScriptExhaustedError, SimulatedCrash

    assert not issubclass(SimulatedCrash, Exception)
    assert not issubclass(ScriptExhaustedError, Exception)


ALL_MODULES = """
import importlib, pkgutil, durable_agents
for info in pkgutil.walk_packages(durable_agents.__path__, "durable_agents."):
    if not info.name.endswith("pytest_plugin"):
        importlib.import_module(info.name)
"""

PATCH_CLOCK_AND_RANDOMNESS = """
import os, random, secrets, time, uuid
def boom(*a, **k):
    raise AssertionError("a clock or random source was read at import time")
for mod, names in ((time, ["time", "time_ns", "monotonic", "perf_counter"]),
                   (uuid, ["uuid4", "uuid1"]), (os, ["urandom"]),
                   (random, ["random", "randint", "getrandbits"]),
                   (secrets, ["token_hex", "token_bytes"])):
    for n in names:
        setattr(mod, n, boom)
"""


def test_importing_the_library_reads_no_clock_and_no_randomness() -> None:
    """Workers snapshot memory after import: our module top levels must not draw
    random numbers or read the clock. Third-party and stdlib modules are imported
    first (their import-time behaviour is theirs), then every durable_agents module
    is imported with the clock and random sources booby-trapped."""
    listing = ALL_MODULES + "import sys; print(' '.join(m for m in sys.modules))"
    names = subprocess.run(
        [sys.executable, "-c", listing], capture_output=True, text=True, check=True
    ).stdout.split()
    others = [n for n in names if not n.startswith("durable_agents") and n != "__main__"]
    preload = (
        f"import importlib\nfor n in {others!r}:\n"
        "    try:\n        importlib.import_module(n)\n    except Exception:\n        pass\n"
    )
    code = preload + PATCH_CLOCK_AND_RANDOMNESS + ALL_MODULES + "print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr


# What neither `import durable_agents` nor the Worker's own imports load (issue 33): the
# model adapters, the offline models, the test-value generator, MCP, httpx's client, the
# stores a Worker does not use. Each loads when first used.
LOADED_ON_FIRST_USE = [
    "durable_agents.llm.anthropic", "durable_agents.llm.openai", "durable_agents.llm.workers_ai",
    "durable_agents.llm._retry", "durable_agents._schema.values",
    "durable_agents._schema.regex_sample", "durable_agents._schema.formats", "durable_agents.mcp",
    "durable_agents.stores.sqlite", "durable_agents.stores.durable_object",
]  # fmt: skip
# The Worker's imports (src/entry.py's, but `workers`, which runs only in a Worker).
WORKER_IMPORTS = """
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.agent_module import serve_agent
from durable_agents.cloudflare.alarms import ObjectAlarm
from durable_agents.cloudflare.app import handle_request
from durable_agents.cloudflare.js_streams import readable_stream
"""


def loaded_after(code: str) -> set[str]:
    """The modules a fresh Python has loaded after running `code`."""
    listing = code + "\nimport sys; print(' '.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", listing], capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_importing_the_library_loads_no_adapter_no_test_values_and_no_httpx() -> None:
    loaded = loaded_after("import durable_agents")
    assert loaded.isdisjoint([*LOADED_ON_FIRST_USE, "durable_agents.llm.offline", "httpx"])
    assert "durable_agents.stores.memory" not in loaded


def test_the_workers_imports_load_only_what_a_turn_needs() -> None:
    assert loaded_after(WORKER_IMPORTS).isdisjoint(LOADED_ON_FIRST_USE)


@pytest.mark.parametrize(
    "module_name", ["durable_agents.llm", "durable_agents.stores", "durable_agents.cloudflare"]
)
def test_each_name_a_package_loads_on_first_use_is_there(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_the_llm_protocol_is_one_object_beside_the_adapters() -> None:
    import durable_agents.llm
    import durable_agents.llm.base

    assert durable_agents.LLM is durable_agents.llm.LLM is durable_agents.llm.base.LLM
