"""The documentation as a test: README.md and docs/ (MkDocs, built by scripts/docs).

- Every ```python block is linted with ruff (the project's rules) and type-checked with
  mypy (its defaults plus `check_untyped_defs`: doc snippets are not held to --strict).
- Every Python block is run, offline, each in a directory of its own holding a copy of
  wrangler.toml (as a project would): an agent module (`title="src/agent.py"`) through
  `check_agent`; a test module (`title="tests/test_*.py"`) with pytest; anything else
  as a program. The page's agent module, if it has one, sits beside the block as
  `agent.py`, so a test that imports `agent` gets it.
- A block marked `<!-- docs-test: fragment -->` is not run, and is linted with the
  names and top-level awaits it takes from the text around it allowed; one marked
  `<!-- docs-test: lint only (why) -->` is not run. Fragments should stay rare. The
  markers are described in tests/support/doc_blocks.py.
- `mkdocs build --strict` passes (a broken link, anchor or reference is a warning);
  every name of a public module's `__all__` is on an API reference page; README.md is at
  most 300 lines and its relative links (and every page's) lead somewhere.

The curl walk-throughs run against scripts/dev in tests/cloudflare/test_docs_walkthrough.py.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.doc_blocks import DOCS, ROOT, Block, all_blocks, blocks, doc_files

PYTHON_BLOCKS = all_blocks("python")
VENV_BIN = Path(sys.executable).parent
# A fragment may use names defined in the text around it, await at the top level, and
# list imports for show.
FRAGMENT_RUFF = "# ruff: noqa: F401, F821, F704, I001, RUF100\n"
FRAGMENT_MYPY = '# mypy: disable-error-code="name-defined,top-level-await"\n'
MYPY_CONFIG = """\
[mypy]
python_version = 3.11
check_untyped_defs = True
mypy_path = {src}
cache_dir = {cache}

[mypy-workers.*,js,pyodide.*]
ignore_missing_imports = True
"""
RUN_TIMEOUT_S = 120


def _tool(name: str) -> str:
    found = VENV_BIN / name
    return str(found) if found.exists() else (shutil.which(name) or name)


def _is_fragment(block: Block) -> bool:
    return block.marker == "fragment"


def _runs(block: Block) -> bool:
    return block.marker is None


def _agent_module(block: Block) -> Block | None:
    """The agent module (`src/agent.py`) on the block's page, if it has one."""
    return next((b for b in blocks(block.path) if b.title == "src/agent.py"), None)


def _source(block: Block) -> str:
    if _is_fragment(block):
        return FRAGMENT_RUFF + FRAGMENT_MYPY + block.text
    return block.text


def _offline_env(directory: Path) -> dict[str, str]:
    """This environment without any LLM setting (the blocks' models are offline), with
    the repo's src/ first on the path (not whichever copy .venv was installed from)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(directory)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _written(blocks_: list[Block], directory: Path) -> dict[Path, Block]:
    """Each block as `<slug>.py` in `directory` (file names unique across the docs)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for block in blocks_:
        path = (directory / f"doc_{block.slug}.py").resolve()
        path.write_text(_source(block), encoding="utf-8")
        files[path] = block
    return files


def _located(output: str, files: dict[Path, Block], cwd: Path) -> str:
    """`output` with each `<file>:<line>` of a written block turned into the block's
    place in the docs."""

    def place(match: re.Match[str]) -> str:
        path = (cwd / match[1]).resolve()
        block = files.get(path)
        if block is None:
            return match[0]
        line = int(match[2]) - (2 if _is_fragment(block) else 0)
        return f"{block.path.relative_to(ROOT)}:{block.line + line}"

    return re.sub(r"([^\s:]+\.py):(\d+)", place, output)


def test_there_are_python_blocks_and_few_fragments() -> None:
    assert len(PYTHON_BLOCKS) >= 10
    fragments = [b.where for b in PYTHON_BLOCKS if _is_fragment(b)]
    assert len(fragments) <= 3, f"fragments should be rare: {fragments}"
    unknown = [
        b.where
        for b in all_blocks(("python", "sh", "bash"))
        if b.marker is not None
        and not re.fullmatch(r"fragment|lint only.*|not run.*|crash after \".+\"", b.marker)
    ]
    assert not unknown, f"markers tests/support/doc_blocks.py does not know: {unknown}"


def test_python_blocks_pass_ruff(tmp_path: Path) -> None:
    files = _written(PYTHON_BLOCKS, tmp_path)
    done = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml")]
        + [str(p) for p in files],
        cwd=ROOT,  # the config's `src` (first-party imports) is relative to it
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, _located(done.stdout + done.stderr, files, ROOT)


def test_python_blocks_pass_mypy(tmp_path: Path) -> None:
    files = _written(PYTHON_BLOCKS, tmp_path / "blocks")
    config = tmp_path / "mypy.ini"
    cache = ROOT / ".cache" / "mypy-docs"  # warm across runs; .cache/ is not tracked
    config.write_text(MYPY_CONFIG.format(src=ROOT / "src", cache=cache), encoding="utf-8")
    done = subprocess.run(
        [_tool("mypy"), "--config-file", str(config), "--no-error-summary"]
        + [str(p) for p in files],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, _located(done.stdout + done.stderr, files, tmp_path)


@pytest.mark.parametrize("block", [b for b in PYTHON_BLOCKS if _runs(b)], ids=lambda b: b.where)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    shutil.copy(ROOT / "wrangler.toml", tmp_path / "wrangler.toml")
    agent = _agent_module(block)
    if agent is not None:
        (tmp_path / "agent.py").write_text(agent.text, encoding="utf-8")
    title = Path(block.title or "")
    if block.title == "src/agent.py":
        command = [
            "-c",
            "import importlib\n"
            "from durable_agents.testing import check_agent\n"
            "print(check_agent(importlib.import_module('agent')))\n",
        ]
    elif title.name.startswith("test_"):
        (tmp_path / title.name).write_text(block.text, encoding="utf-8")
        command = [
            "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
            "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function",
            title.name,
        ]  # fmt: skip
    else:
        script = tmp_path / (title.name or "block.py")
        script.write_text(block.text, encoding="utf-8")
        command = [script.name]
    done = subprocess.run(
        [sys.executable, *command],
        cwd=tmp_path,
        env=_offline_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"


def test_mkdocs_build_strict_has_no_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [_tool("mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "reference" / "durable_agents.html").is_file()


PUBLIC_MODULES = {
    "durable_agents": "durable_agents.md",
    "durable_agents.llm": "llm.md",
    "durable_agents.stores": "stores.md",
    "durable_agents.cloudflare": "cloudflare.md",
    "durable_agents.testing": "testing.md",
    "durable_agents.mcp": "mcp.md",
}


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_public_name_is_in_the_api_reference(module: str) -> None:
    """A page either renders the module whole (`::: module` with no `members:` option,
    so every name of its `__all__` is there) or names each object (`::: module.Name`)."""
    page = (DOCS / "reference" / PUBLIC_MODULES[module]).read_text(encoding="utf-8")
    directives = re.findall(r"^::: ([\w.]+)\n((?:    .*\n)*)", page, re.M)
    whole = [options for name, options in directives if name == module]
    if whole and not any("members:" in options for options in whole):
        return
    named = {name.rsplit(".", 1)[-1] for name, _ in directives}
    missing = sorted(set(importlib.import_module(module).__all__) - named)
    assert not missing, f"docs/reference/{PUBLIC_MODULES[module]} lacks {missing}"


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines; the rest belongs in docs/"


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (its toc extension's slugs)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        plain = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", plain)).strip("-"))
    return found


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:|#|/", target):
            continue  # another site, this page's own anchor (MkDocs checks those), absolute
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve()
        if not resolved.exists() or (
            anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved)
        ):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that lead nowhere: {broken}"
