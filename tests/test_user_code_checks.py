"""Your own files meet checks that find bugs; the kit's code meets strict ones.

`scripts/test` lints and type-checks the whole project. `src/agent.py` and
`tests/test_agent.py` are yours: ruff's default rules and mypy without
`--strict` (pyproject.toml says so per file). Here an agent written without
annotations (tests/agents/unannotated_refunds.py) takes the template's place
in a copy of the project, and every check `scripts/test` runs over it passes;
the same agent put in the kit's own tree fails strict mypy, so the split is
what lets it through.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the checks read, with the un-annotated agent as src/agent.py."""
    root = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "wrangler.toml"):
        shutil.copy(PROJECT / name, root)
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
    return root


def run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300, check=False)


def test_ruff_holds_your_files_to_its_default_rules(project: Path) -> None:
    checked = run(project, str(BIN / "ruff"), "check", "--no-cache", "src", "tests", "examples")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    formatted = run(
        project, str(BIN / "ruff"), "format", "--check", "--no-cache", "src", "tests", "examples"
    )
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


def test_mypy_checks_your_agent_without_strict_and_the_kit_with_it(project: Path) -> None:
    cache = ["--cache-dir", str(project / ".mypy_cache")]
    checked = run(project, str(BIN / "mypy"), *cache)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The same file as part of the kit is refused: the override is what lets it through.
    kit_file = project / "src" / "durable_agents" / "unannotated.py"
    shutil.copy(AGENT, kit_file)
    try:
        strict = run(project, str(BIN / "mypy"), *cache)
    finally:
        kit_file.unlink()
    assert strict.returncode == 1
    assert "unannotated.py" in strict.stdout
    assert "[no-untyped-def]" in strict.stdout


def test_the_template_test_passes_with_the_unannotated_agent(project: Path) -> None:
    tested = run(
        project, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "no:xdist", "--rootdir", str(project), "tests/test_agent.py",
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout
