#!/usr/bin/env python3
"""Stage the Worker's modules: what src/entry.py imports from src/, into build/worker/.

    python3 scripts/build_worker.py          # wrangler.toml's [build] command runs it

`npx wrangler deploy` (and `--dry-run`, and `wrangler dev`) run this first,
then upload `build/worker/` (wrangler.toml's `main` is `build/worker/entry.py`)
and `python_modules/`. Why a staged copy: wrangler uploads every `.py` file
under the directory of `main`, whatever the config says (it adds a rule
`**/*.py` for a Python Worker, refuses `PythonModule` rules in the config,
and always searches that directory). Pointed at `src/`, it would ship the
testing kit, the CLI, the SQLite store and `durable_agents.egg-info/`.

What is staged: `src/entry.py` and every module of `src/` it imports,
directly or through others (`import agent` brings `src/agent.py` and what
it imports), and each agent module of `src/agents/` (the Worker imports those by the
folder's listing: `durable_agents.cloudflare.served_agents`) with what it imports, the
folder as a package (an empty `__init__.py` where it has none); following every
`import` statement, also inside functions (a Worker runs those too), except under
`if TYPE_CHECKING:`; each package's
`__init__.py` comes along. A module that does not parse is staged as it is, its
imports not followed: the Worker's import of it fails, naming the line. Left out
even when a module names them: the CPython-only modules in `CPYTHON_ONLY`,
which the Worker never imports (`durable_agents.stores` names `sqlite_store` and
`postgres_store` lazily, for CPython users).
If the Worker did import one, it would fail at once on deploy; the kit's
tests/test_bundle.py imports the staged bundle inside the local runtime
and serves a turn from it.

Staged too: the package data the Worker reads at run time, every `*.sql`, `*.html` and
`*.css` file (DATA_SUFFIXES) in the folder of a staged package, or in a sub-folder of
it that is no package of its own (`durable_agents/stores/migrations/`). wrangler
uploads them as Text modules (its own rules for .sql and .html, wrangler.toml's
`[[rules]]` for .css; a .js file would be a JavaScript module), and workerd shows every
Text module to Python as a read-only file beside the modules (under /session/metadata/),
so `importlib.resources` reads them in the Worker as on CPython
(`durable_agents._resources.read_text`).

The kit's own modules (`src/entry.py`, `durable_agents`: KIT) go into the deploy
bundle bare (`bare_source`): without their docstrings and full-line comments, text the
Worker never reads and a third of the kit's size gzipped. Each is blanked, so every line
keeps its number and a traceback from the deployed Worker names the source's lines. Your
modules keep theirs: a tool's docstring is its description for the model. A dev
server's staging (`stage()`, or DURABLE_AGENTS_DEV_STAGE below) keeps the kit as it is:
the same code, and one edit restages in less time.

Under `scripts/dev` (DURABLE_AGENTS_DEV_STAGE names that server's staging
folder; see runtime/dev_limits.py) the modules go to `<folder>/worker/`
instead, with the files of `<folder>/extra/` (the WORKERS_PLAN limits and
the main module that applies them): each dev server serves its own copy,
and build/worker/ stays what a deploy uploads.

stdlib only; Python >= 3.11.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no lock (two builds at once are unlikely there)
    fcntl = None  # type: ignore[assignment]

PROJECT = Path(__file__).resolve().parent.parent
SRC = PROJECT / "src"
OUT = PROJECT / "build" / "worker"
ROOTS = ("entry",)
# Set by the dev server (runtime/dev_limits.py): the folder of its staged Worker.
DEV_STAGE = "DURABLE_AGENTS_DEV_STAGE"
# Modules (and packages) the Worker never imports, though Worker modules name them.
CPYTHON_ONLY = (
    "durable_agents.testing",  # test doubles, check_agent, the pytest plugin
    "durable_agents.cli",  # the `durable-agents` command
    "durable_agents.stores.sqlite",  # sqlite_store: SQLite files, not D1
    "durable_agents.stores.postgres",  # postgres_store: psycopg, the `postgres` extra
)
# Package data the Worker reads (the schema's migrations, pages, styles).
DATA_SUFFIXES = (".sql", ".html", ".css")
# The kit's modules, staged bare for a deploy (`bare_source`); not yours.
KIT = ("entry", "durable_agents")
# What each module imports, kept between builds (KnownImports): parsing the Worker's ~90
# modules takes ~0.3 s, which each start of scripts/dev and each deploy would spend again.
IMPORTS_CACHE = PROJECT / ".cache" / "build-worker-imports.json"


def source_modules(src: Path) -> dict[str, Path]:
    """Every module under `src`, by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if any(not part.isidentifier() for part in parts):  # *.egg-info, __pycache__-like
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name the module's import statements may load (outside TYPE_CHECKING)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module:
                found.add(module)
            found.update(f"{module}.{alias.name}" if module else alias.name for alias in node.names)
        for child in _statements_in(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _statements_in(node: ast.AST) -> Iterator[ast.AST]:
    """The statements directly inside `node` (its bodies, `else`, `finally`, `except` and
    `case` blocks): an import is a statement, so no expression is looked into (the whole
    tree's nodes take ~0.3 s for the kit's modules; its statements a tenth of it)."""
    for _, value in ast.iter_fields(node):
        if isinstance(value, list):
            for child in value:
                if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                    yield child


class KnownImports:
    """`imported_names` of each module, read from IMPORTS_CACHE where the module's file has
    the same modification time and size as when it was parsed; `save()` writes back what
    this build parsed, and drops the files that are gone (tests' temporary copies)."""

    def __init__(self, file: Path = IMPORTS_CACHE) -> None:
        self.file = file
        try:
            entries = json.loads(file.read_text())
        except (OSError, ValueError):  # none yet, or cut short: parsed again
            entries = {}
        self.entries: dict[str, list[Any]] = entries if isinstance(entries, dict) else {}
        self.parsed = False

    def of(self, name: str, path: Path) -> set[str]:
        stat = path.stat()
        stamp = [stat.st_mtime_ns, stat.st_size]
        key = f"{name} {path}"
        entry = self.entries.get(key)
        if isinstance(entry, list) and entry[:2] == stamp:
            return set(entry[2])
        names = imported_names(name, path)
        self.entries[key] = [*stamp, sorted(names)]
        self.parsed = True
        return names

    def save(self) -> None:
        if not self.parsed:
            return
        kept = {key: entry for key, entry in self.entries.items()
                if Path(key.split(" ", 1)[1]).is_file()}  # fmt: skip
        # Several servers may build at once: each writes a file of its own, then swaps it in.
        partial = self.file.with_name(f".{self.file.name}.{os.getpid()}")
        with contextlib.suppress(OSError):  # a read-only checkout: parsed again next time
            self.file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(kept))
            partial.replace(self.file)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in packages)


def _excluded(name: str) -> bool:
    return _within(name, CPYTHON_ONLY)


def docstrings(tree: ast.AST) -> list[ast.Constant]:
    """The docstrings of a module's syntax tree: its own, its classes' and its functions'."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.append(first.value)
    return found


def bare_source(source: str) -> str:
    """`source` line for line, each docstring emptied (`""`) and each full-line comment
    blanked: the same code (the same syntax tree but for the docstrings' text; tests/
    test_bundle.py checks the kit's every module), and the same line numbers. A comment
    line inside a string that spans lines is the string's text, and stays."""
    tree = ast.parse(source)
    lines = source.encode().splitlines(keepends=True)  # ast's columns count UTF-8 bytes
    in_strings: set[int] = set()  # 0-based lines of strings that span lines
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.JoinedStr) and node.end_lineno != node.lineno:
            in_strings.update(range(node.lineno - 1, (node.end_lineno or node.lineno)))
    for doc in docstrings(tree):
        first, last = doc.lineno - 1, (doc.end_lineno or doc.lineno) - 1
        if lines[last][doc.end_col_offset or 0 :].strip():  # code after it on its line
            continue
        lines[first] = lines[first][: doc.col_offset] + b'""\n'
        lines[first + 1 : last + 1] = [b"\n"] * (last - first)
    for number, line in enumerate(lines):
        if number not in in_strings and line.lstrip().startswith(b"#"):
            lines[number] = b"\n"
    return b"".join(lines).decode()


def agent_override() -> dict[str, Path]:
    """The agent module to stage instead of src/agent.py: the file DURABLE_AGENTS_AGENT names
    (the dev server's `--agent FILE` sets it for the build wrangler runs), else none."""
    agent = os.environ.get("DURABLE_AGENTS_AGENT")
    return {"agent": Path(agent).resolve()} if agent else {}


# The agent modules' package: src/agents/, or the folder DURABLE_AGENTS_AGENTS names (the
# dev server's `--agents DIR`), served at /agents/<file's stem>/sessions/...
AGENTS = "agents"
AGENTS_OVERRIDE = "DURABLE_AGENTS_AGENTS"


def agents_folder(src: Path = SRC) -> Path:
    """The folder of the agent modules to stage: DURABLE_AGENTS_AGENTS's, else src/agents/."""
    folder = os.environ.get(AGENTS_OVERRIDE)
    return Path(folder).resolve() if folder else src / AGENTS


def agent_modules(folder: Path) -> dict[str, Path]:
    """Every `*.py` file of `folder` (not its sub-folders), by module name (`agents.<stem>`;
    the package itself by its `__init__.py`). A stem that is no agent's name is staged too:
    the Worker refuses it at start, naming the file (`served_agents.check_served_name`)."""
    if not folder.is_dir():
        return {}
    found = {f"{AGENTS}.{p.stem}": p for p in sorted(folder.glob("*.py")) if p.stem != "__init__"}
    if (folder / "__init__.py").is_file():
        found[AGENTS] = folder / "__init__.py"
    return found


def worker_modules(src: Path = SRC, roots: tuple[str, ...] = ROOTS) -> dict[str, Path]:
    """The modules of `src` the Worker's `roots` import, transitively, minus CPYTHON_ONLY;
    with each agent module of `agents_folder(src)` among the roots."""
    modules = source_modules(src)
    if os.environ.get(AGENTS_OVERRIDE):  # another folder's agents, not src/agents/'s
        modules = {n: p for n, p in modules.items() if not _within(n, (AGENTS,))}
    agents = agent_modules(agents_folder(src))
    available = {**modules, **agents, **agent_override()}
    known = KnownImports()
    wanted: dict[str, Path] = {}
    queue = [*roots, *sorted(agents)]
    while queue:
        name = queue.pop()
        if name in wanted or _excluded(name):
            continue
        parts = name.split(".")
        # `import a.b.c` loads a, a.b and a.b.c; a name that is not a module of src/
        # (the stdlib, python_modules/, an attribute like `from x import y`) is skipped.
        for i in range(1, len(parts)):
            queue.append(".".join(parts[:i]))
        path = available.get(name)
        if path is None:
            continue
        wanted[name] = path
        try:
            queue.extend(known.of(name, path))
        except SyntaxError:  # staged as it is: the Worker's import of it names the line
            continue
    known.save()
    missing = [root for root in roots if root not in wanted]
    if missing:
        raise SystemExit(f"build_worker: no module {missing} in {src}")
    return dict(sorted(wanted.items()))


def data_files(modules: dict[str, Path]) -> dict[Path, Path]:
    """The package data of the staged `modules`, by where it goes in the bundle: each
    DATA_SUFFIXES file in a staged package's folder or in a sub-folder that is no package
    (the nearest folder with an `__init__.py` above a file is the package it belongs to)."""
    packages = {
        path.parent: Path(*name.split("."))
        for name, path in modules.items()
        if path.name == "__init__.py" and name
    }
    found: dict[Path, Path] = {}
    for folder, target in packages.items():
        for path in sorted(folder.rglob("*")):
            if path.suffix not in DATA_SUFFIXES or not path.is_file():
                continue
            owner = next(p for p in path.parents if (p / "__init__.py").is_file())
            if owner == folder:
                found[target / path.relative_to(folder)] = path
    return found


def stage(
    out: Path = OUT, src: Path = SRC, extra: Path | None = None, *, bare: bool = False
) -> dict[str, Path]:
    """Replace `out` with the Worker's modules and their package data (`data_files`), and
    the files of the folder `extra`; with `bare`, the kit's modules bare (`bare_source`).
    A failed build leaves `out` as it was; two builds at once (two dry runs, two
    `wrangler dev`) take turns."""
    modules = worker_modules(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{out.name}.lock"):
        _replace(out, modules, extra, bare)
    return modules


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _replace(out: Path, modules: dict[str, Path], extra: Path | None, bare: bool) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for name, path in modules.items():
            target = staging / _module_file(name, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy(path, target, bare and _within(name, KIT))
        if AGENTS not in modules and any(_within(n, (AGENTS,)) for n in modules):
            (staging / AGENTS / "__init__.py").write_text("")  # src/agents/ as a package
        for target_name, path in data_files(modules).items():
            (staging / target_name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, staging / target_name)
        for path in sorted(extra.iterdir()) if extra is not None else []:
            shutil.copyfile(path, staging / path.name)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _copy(path: Path, target: Path, bare: bool) -> None:
    if bare:
        source = path.read_text(encoding="utf-8")
        with contextlib.suppress(SyntaxError):  # staged as it is: its import names the line
            source = bare_source(source)
        target.write_text(source, encoding="utf-8")
    else:
        shutil.copy2(path, target)


def _module_file(name: str, path: Path) -> Path:
    """Where module `name` goes in the bundle (by its name: an override may live elsewhere)."""
    parts = name.split(".")
    if path.name == "__init__.py":
        return Path(*parts, "__init__.py")
    return Path(*parts[:-1], f"{parts[-1]}.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to stage (build/worker)")
    parser.add_argument("--list", action="store_true", help="print the modules, stage nothing")
    args = parser.parse_args(argv)
    if args.list:
        modules = worker_modules()
        for name, path in modules.items():
            print(f"{name}\t{path}")
        for target, path in data_files(modules).items():
            print(f"{target.as_posix()}\t{path}")
        return 0
    dev_stage = os.environ.get(DEV_STAGE)
    if dev_stage and args.out == OUT:
        args.out, extra = Path(dev_stage) / "worker", Path(dev_stage) / "extra"
    else:
        extra = None
    modules = stage(args.out, extra=extra, bare=extra is None)  # a dev server's: as it is
    data = data_files(modules)
    size = sum(path.stat().st_size for path in [*modules.values(), *data.values()])
    unused = sorted(set(source_modules(SRC)) - set(modules))
    print(
        f"build_worker: {len(modules)} modules and {len(data)} data files of src/ "
        f"({size / 1024:.1f} KiB) staged in "
        f"{args.out.relative_to(PROJECT) if args.out.is_relative_to(PROJECT) else args.out}; "
        f"left out: {', '.join(unused) or 'nothing'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
