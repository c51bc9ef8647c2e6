"""runtime/kit_files.py: which files are the kit's (strict checks) and which are yours."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("kit_files", PROJECT / "runtime" / "kit_files.py")
assert _spec is not None
assert _spec.loader is not None
kit_files = importlib.util.module_from_spec(_spec)
sys.modules["kit_files"] = kit_files
_spec.loader.exec_module(kit_files)


def test_every_file_it_names_as_the_kits_exists() -> None:
    missing = [f for f in sorted(kit_files.KIT_FILES) if not (PROJECT / f).is_file()]
    assert missing == []
    assert [f for f in kit_files.KIT_FOLDERS if not (PROJECT / f).is_dir()] == []


def test_the_templates_agent_and_its_test_are_yours_and_so_is_any_file_you_add() -> None:
    assert not kit_files.is_kit("src/agent.py")
    assert not kit_files.is_kit("tests/test_agent.py")
    assert not kit_files.is_kit("tests/catalog_server.py")  # beside the tests
    assert not kit_files.is_kit("src/loans/models.py")  # a package your agent imports
    assert not kit_files.is_kit("tools/seed.py")
    assert kit_files.is_kit("src/durable_agents/run.py")
    assert kit_files.is_kit("src/entry.py")
    assert kit_files.is_kit("tests/cloudflare/test_app.py")
    assert kit_files.is_kit("tests/test_run.py")


def test_the_lists_hold_every_python_file_once_and_no_set_up_folder(tmp_path: Path) -> None:
    for name in ("src/agent.py", "src/durable_agents/run.py", "tests/test_run.py",
                 "tests/mine.py", ".venv/lib/x.py", "node_modules/a/b.py",
                 "python_modules/pydantic/main.py", "build/worker/entry.py",
                 "src/durable_agents.egg-info/x.py"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert kit_files.kit_files(tmp_path) == ["src/durable_agents/run.py", "tests/test_run.py"]
    assert kit_files.your_files(tmp_path) == ["src/agent.py", "tests/mine.py"]
