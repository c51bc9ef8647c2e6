"""The Worker's deploy bundle holds only what the Worker imports, and the Worker runs from it alone.

The bundle is what `wrangler deploy --dry-run --outdir DIR` makes, offline
(wrangler.toml's `[build]` stages the Worker's modules with
scripts/build_worker.py first). The Worker is then served from that folder alone,
on real workerd (`scripts/dev --config` on a project holding only the bundle:
scripts/bundle_size.py). Needs `scripts/setup-runtime`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parents[1]
CONFIG = PROJECT / "wrangler.toml"
FREE_PLAN_GZIP_KIB = 3 * 1024


def _script(name: str) -> ModuleType:
    return _module(name, PROJECT / "scripts" / f"{name}.py")


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build_worker = _script("build_worker")
bundle_size = _script("bundle_size")
agent_turn = _module("agent_turn", PROJECT / "runtime" / "agent_turn.py")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return bundle_size.dry_run(tmp_path_factory.mktemp("bundle") / "dist", CONFIG)


def test_the_bundle_holds_the_workers_modules_and_nothing_else(bundle: Any) -> None:
    assert bundle.worker_modules == set(build_worker.worker_modules())
    assert {
        "entry",
        "agent",
        "durable_agents",
        "durable_agents.run",
        "durable_agents.stores.base",
        "durable_agents.cloudflare.routes",
        "durable_agents.stores.d1",
        "durable_agents.cloudflare.fetch_transport",
        "durable_agents.llm.settings",
    } <= bundle.worker_modules
    not_for_the_worker = re.compile(
        r"(^|/)(testing|tests|examples)/|(^|/)cli\.py$|stores/sqlite\.py$|egg-info|\.txt$"
    )
    assert [f for f in bundle.worker_files if not_for_the_worker.search(f)] == []
    # Modules, and the package data build_worker stages beside them (the schema's
    # migrations): nothing else.
    staged = build_worker.worker_modules()
    data = {target.as_posix() for target in build_worker.data_files(staged)}
    assert {f for f in bundle.worker_files if not f.endswith(".py")} == data
    assert "durable_agents/stores/migrations/0001_init.sql" in data
    vendored_but_never_imported = re.compile(r"^python_modules/pydantic/v1/|\.pyi$|\.pyc$")
    assert [f for f in bundle.vendored_files if vendored_but_never_imported.search(f)] == []
    assert "python_modules/pydantic_core/core_schema.py" in bundle.vendored_files
    assert bundle.gzip_kib < FREE_PLAN_GZIP_KIB


def test_the_worker_starts_and_serves_a_turn_of_the_users_agent_from_its_bundle_alone(
    bundle: Any,
) -> None:
    # src/agent.py is the user's: whatever agent it holds, its turn runs from the bundle
    # (offline, its upstreams answered by its dev stubs, an MCP server with no tools for a
    # toolset without one, 200 {} for any other URL) to an answer, or to a call that waits
    # for a person's approval: runtime/agent_turn.py, scripts/check's last step.
    ran = agent_turn.agent_turn(PROJECT / "src" / "agent.py", CONFIG, bundle=bundle)
    assert ran["status"] == 200, f"{ran['body']}\n{ran['output'][-3000:]}"
    assert ran["body"].get("status") in agent_turn.ANSWERS, (
        f"{ran['body']}\n{ran['output'][-3000:]}"
    )
    assert ran["body"]["steps"] >= 1, ran["body"]
    assert "D1 migrations: 0001_init.sql" in ran["output"]  # applied to the bundle's D1
    assert ran["start_s"] > 0


def test_build_worker_follows_every_import_but_type_checking_and_cpython_only(
    tmp_path: Path,
) -> None:
    files = {
        "entry.py": "import agent\nfrom durable_agents.cloudflare import app\n",
        "agent.py": (
            "from typing import TYPE_CHECKING\n"
            "from helpers import util\n"
            "if TYPE_CHECKING:\n    import typed_only\n"
            "def make_deps(env, http):\n    import lazy\n"
        ),
        "helpers/__init__.py": "",
        "helpers/util.py": "from . import sibling\nfrom ..outside import nothing  # not in src\n",
        "helpers/sibling.py": "import json\n",
        "typed_only.py": "",
        "lazy.py": "",
        "unused.py": "",
        "durable_agents/__init__.py": "from .stores import base\n",
        "durable_agents/stores/__init__.py": (
            "from .base import Store\n"
            "def __getattr__(name):\n    from .sqlite import sqlite_store\n"
        ),
        "durable_agents/stores/base.py": "",
        "durable_agents/stores/migrations/0001_init.sql": "CREATE TABLE t (x);\n",
        "durable_agents/stores/sqlite.py": "",
        "durable_agents/cloudflare/page.html": "<p>hi</p>\n",
        "durable_agents/testing/page.css": "p {}\n",  # a package the Worker never imports
        "durable_agents/cloudflare/__init__.py": "",
        "durable_agents/cloudflare/app.py": "from ..testing import check_agent\n",
        "durable_agents/testing/__init__.py": "",
        "durable_agents.egg-info/top_level.txt": "durable_agents\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    staged = build_worker.stage(tmp_path / "out", tmp_path)
    assert set(staged) == {
        "entry", "agent", "helpers", "helpers.util", "helpers.sibling", "lazy",
        "durable_agents", "durable_agents.stores", "durable_agents.stores.base",
        "durable_agents.cloudflare", "durable_agents.cloudflare.app",
    }  # fmt: skip
    written = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.*")
    )
    modules = [str(path.relative_to(tmp_path)) for path in staged.values()]
    data = ["durable_agents/cloudflare/page.html", "durable_agents/stores/migrations/0001_init.sql"]
    assert written == sorted([*modules, *data])
