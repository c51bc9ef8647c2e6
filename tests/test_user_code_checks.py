"""Your own files meet checks that find bugs; the kit's code meets strict ones.

`scripts/lint` (run by `scripts/test` and, for yours only, by `scripts/check`)
lints and type-checks the whole project. `src/agent.py`, `tests/test_agent.py`
and every Python file you add, wherever it is, are yours: ruff's default rules
and mypy without `--strict` (runtime/kit_files.py says which files are the
kit's). Here an agent written without annotations
(tests/agents/unannotated_refunds.py) takes the template's place in a copy of
the project, beside a second file of yours (an MCP server beside the tests),
and `scripts/lint` passes; the same agent put in the kit's own tree fails
strict mypy, so the split is what lets it through.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
AGENT = Path(__file__).parent / "agents" / "unannotated_refunds.py"
BIN = Path(sys.executable).parent
TEST_AGENT = """\
import importlib
from durable_agents.testing import check_agent
def test_agent():
    print(check_agent(importlib.import_module("agent")))
"""
# Yours too, though no name says so: unsorted imports, a long line, no annotations.
SECOND_FILE = f"""\
import sys
import json
def answer(request):
    return json.dumps({{"jsonrpc": "2.0", "id": request.get("id"), "note": "{"x" * 100}"}})
if __name__ == "__main__":
    print(answer(json.loads(sys.stdin.read())))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the checks read, with the un-annotated agent as src/agent.py."""
    root = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "wrangler.toml"):
        shutil.copy(PROJECT / name, root)
    for name in ("scripts/lint", "scripts/check", "runtime/kit_files.py", "runtime/mypy-yours.ini"):
        (root / name).parent.mkdir(exist_ok=True)
        shutil.copy2(PROJECT / name, root / name)
    (root / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(PROJECT / "src", root / "src", ignore=ignore)
    shutil.copytree(PROJECT / "examples", root / "examples", ignore=ignore)
    (root / "tests").mkdir()
    shutil.copy(AGENT, root / "src" / "agent.py")
    # mypy's cache of the project's own run (scripts/test runs mypy before pytest), if any:
    # mypy rechecks what differs (by content) and reuses the rest, so the checks below say
    # what a cold run says, in a fraction of its time (the kit's dependencies, pydantic
    # first, are most of a cold run).
    if (PROJECT / ".mypy_cache").is_dir():
        shutil.copytree(PROJECT / ".mypy_cache", root / ".mypy_cache")
    (root / "tests" / "test_agent.py").write_text(TEST_AGENT)
    (root / "tests" / "catalog_server.py").write_text(SECOND_FILE)
    return root


def run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300, check=False)


def test_scripts_lint_holds_your_files_to_the_default_rules_and_the_kit_to_strict_ones(
    project: Path,
) -> None:
    linted = run(project, "scripts/lint")
    assert linted.returncode == 0, linted.stdout + linted.stderr
    said = linted.stdout
    assert "yours: src/agent.py tests/catalog_server.py tests/test_agent.py" in said, said
    # The same files as the kit's are refused: the split is what lets them through.
    kit_file = project / "src" / "durable_agents" / "unannotated.py"
    shutil.copy(AGENT, kit_file)
    shutil.copy(project / "tests" / "catalog_server.py", project / "examples" / "server.py")
    try:
        strict = run(project, "scripts/lint")
        (project / "examples" / "server.py").unlink()
        typed = run(project, "scripts/lint")
    finally:
        kit_file.unlink()
    assert strict.returncode == 1
    assert "examples/server.py:1:" in strict.stdout  # ruff's full set: imports, line length
    assert typed.returncode == 1
    assert "unannotated.py" in typed.stdout
    assert "[no-untyped-def]" in typed.stdout


def test_scripts_check_passes_with_the_unannotated_agent_and_names_what_it_checked(
    project: Path,
) -> None:
    # The everyday command's first two steps (its third, the Worker's turn, is
    # test_bundle.py's): your files' lint and types, and your tests, the template's
    # check_agent among them.
    env = {**os.environ, "DURABLE_AGENTS_SETUP_DONE": "1"}
    env.pop("DURABLE_AGENTS_VARS", None)
    checked = subprocess.run(
        ["scripts/check", "--no-worker"], cwd=project, env=env, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    said = checked.stdout + checked.stderr
    assert checked.returncode == 0, said
    assert "1 passed" in said
    summary = said[said.index("== checked in ") :]
    assert (
        "- your files (src/agent.py tests/catalog_server.py tests/test_agent.py): "
        "ruff's bug rules, mypy's defaults" in summary
    ), summary
    assert "- your tests: tests/test_agent.py" in summary, summary
    assert "- check_agent on your agent (by your tests)" in summary, summary
    assert "- not the Worker (--no-worker)" in summary, summary


DESK = """\
from durable_agents import Agent, agent_tool
AGENT = Agent("desk", "You help.", [agent_tool("ledger", description="Records refunds.")])
def make_deps(env, http):
    return None
"""
LEDGER = """\
from durable_agents import Agent, tool
@tool
async def record(ctx, order: str) -> str:
    \"\"\"Record a refund: a side effect.\"\"\"
    return "recorded " + order
AGENT = Agent("ledger", "You record refunds.", [record])
def make_deps(env, http):
    return None
"""


def test_scripts_check_runs_check_agent_on_agents_that_call_agents_with_them(
    project: Path, tmp_path: Path
) -> None:
    # No test of yours calls check_agent: scripts/check runs it on each served module, with
    # the served ones as agents=, so the desk's agent tool runs the ledger's turns.
    served = tmp_path / "project"
    shutil.copytree(project, served, symlinks=True)
    (served / "tests" / "test_agent.py").write_text("def test_nothing():\n    pass\n")
    (served / "src" / "agents").mkdir()
    (served / "src" / "agents" / "desk.py").write_text(DESK)
    (served / "src" / "agents" / "ledger.py").write_text(LEDGER)
    env = {**os.environ, "DURABLE_AGENTS_SETUP_DONE": "1"}
    env.pop("DURABLE_AGENTS_VARS", None)
    checked = subprocess.run(
        ["scripts/check", "--no-worker"], cwd=served, env=env, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    said = checked.stdout + checked.stderr
    assert checked.returncode == 0, said
    assert "src/agents/desk.py agent 'desk'" in said, said
    assert "child turns of ledger" in said, said
    assert "- check_agent on src/agent.py and src/agents/*.py" in said, said
