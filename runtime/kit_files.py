"""Which Python files of the project are the kit's and which are yours.

The kit's code (src/durable_agents/, src/entry.py, runtime/, scripts/, examples/ and its
own tests) is held to ruff's full rule set, `ruff format` and strict mypy. Yours are held
to checks that find bugs, not style: ruff's default rules and mypy's defaults. Yours are
`src/agent.py` and `tests/test_agent.py` as the template ships them, and every other
Python file you add wherever it is (an MCP server beside your tests, a module your agent
imports): any file this module does not name as the kit's. docs/testing.md ("Your
everyday command") tells how `scripts/check` and `scripts/test` use it.

    python3 runtime/kit_files.py kit     # the kit's files, one per line
    python3 runtime/kit_files.py yours   # yours

A new test of the kit's own at the top of tests/ goes in KIT_TESTS.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

# Folders whose every file is the kit's.
KIT_FOLDERS = (
    "src/durable_agents",
    "runtime",
    "scripts",
    "examples",
    "tests/agents",
    "tests/cloudflare",
    "tests/llm",
    "tests/runtime",
    "tests/support",
    "tests/workers",
)
# The kit's files at the top of src/ and tests/, beside yours.
KIT_TESTS = frozenset(
    f"tests/{name}.py"
    for name in (
        "conftest",
        "test_add_package",
        "test_agent_load_errors",
        "test_agent_tools",
        "test_agent_tools_approvals",
        "test_agent_tools_process",
        "test_approval_edits",
        "test_approvals",
        "test_bound_integers",
        "test_budget",
        "test_bundle",
        "test_check_agent",
        "test_check_agent_agents",
        "test_check_agent_counts",
        "test_check_agent_mcp",
        "test_cli",
        "test_compaction",
        "test_crash_on_write",
        "test_crash_sweep",
        "test_deploy_check",
        "test_deps_typing",
        "test_developer_errors",
        "test_dev_server_config",
        "test_docs",
        "test_errors",
        "test_fan_out",
        "test_history_checks",
        "test_import_direction",
        "test_json_depth",
        "test_kit_files",
        "test_lease",
        "test_mcp",
        "test_mcp_stub",
        "test_model_hostile",
        "test_postgres_store",
        "test_process_concurrency",
        "test_process_crash",
        "test_public_api",
        "test_recurrence",
        "test_run",
        "test_run_events",
        "test_schedules",
        "test_schema_arguments",
        "test_schema_upgrade",
        "test_session_listing",
        "test_sqlite_store",
        "test_store_conformance",
        "test_store_limits",
        "test_timeline",
        "test_timeouts",
        "test_tool_errors",
        "test_tool_parameters",
        "test_turn_features",
        "test_user_code_checks",
        "test_worker",
    )
)
KIT_FILES = KIT_TESTS | {"src/entry.py"}
# Not the project's code: set-up, state and build output.
NOT_CODE = frozenset(
    {".git", ".venv", ".cache", ".wrangler", ".mypy_cache", ".ruff_cache", "build",
     "node_modules", "python_modules", "__pycache__"}
)  # fmt: skip


def is_kit(relative: str) -> bool:
    """Whether the file at `relative` (a path from the project's root, with `/`) is the kit's."""
    return relative in KIT_FILES or relative.startswith(tuple(f"{f}/" for f in KIT_FOLDERS))


def python_files(project: Path = PROJECT) -> Iterator[str]:
    """Every Python file of the project (paths from its root, sorted), set-up folders left
    out."""
    found = []
    for folder, folders, files in os.walk(project):
        folders[:] = [f for f in folders if f not in NOT_CODE and not f.endswith(".egg-info")]
        base = Path(folder).relative_to(project)
        found += [(base / name).as_posix() for name in files if name.endswith(".py")]
    yield from sorted(found)


def kit_files(project: Path = PROJECT) -> list[str]:
    """The kit's Python files in `project`."""
    return [f for f in python_files(project) if is_kit(f)]


def your_files(project: Path = PROJECT) -> list[str]:
    """Yours: every Python file of `project` that is not the kit's."""
    return [f for f in python_files(project) if not is_kit(f)]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("kit", "yours"):
        print("usage: kit_files.py kit|yours", file=sys.stderr)
        return 2
    print("\n".join(kit_files() if argv[0] == "kit" else your_files()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
