"""Imports point one way: examples -> kit; cloudflare -> llm -> core; never back.

    examples/*, src/agent.py   the public kit only (no `_private` module); an agent
                               module never the testing kit (the Worker bundles it)
    durable_agents.cloudflare  core and llm; never testing or the CLI
    durable_agents.llm         core; never cloudflare, testing or the CLI;
                               llm/base.py (the LLM protocol) only `messages`
    durable_agents.mcp         core only (its HTTP client and SSE reader are the
                               core's `_http`); never llm, cloudflare, testing or the CLI
    core                       every other module of durable_agents (the run loop,
                               tools, messages, errors, agent, limits, stores):
                               neither cloudflare, nor llm beyond llm.base, nor
                               testing, nor the CLI
    all of durable_agents      never the user's `agent`, the Worker's `entry`,
                               an example or a test helper

Read with `ast` (every import statement, also those inside functions), so
nothing is imported to check it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
KIT = SRC / "durable_agents"
EXAMPLES = ROOT / "examples"

APPLICATIONS = ("durable_agents.cli",)  # built on the kit, not part of the Worker's core


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, *, is_package: bool) -> set[str]:
    """Every module `source` (the module `module`) imports, as absolute dotted names.

    `from M import a` counts as importing `M` and `M.a` (`a` may be a submodule);
    relative imports are resolved against `module`'s package.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    found.discard("__future__")
    return found


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def kit_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(KIT.rglob("*.py")):
        yield module_name(path, SRC), path


def kit_imports(path: Path, name: str) -> set[str]:
    return imports_of(path.read_text(), name, is_package=path.name == "__init__.py")


def helper_modules() -> set[str]:
    """The test helpers, by their old bare names too (a helper was once on sys.path)."""
    return {p.stem for p in (ROOT / "tests" / "support").glob("*.py") if p.stem != "__init__"}


def is_core(name: str) -> bool:
    return not within(
        name,
        "durable_agents.cloudflare",
        "durable_agents.llm",
        "durable_agents.mcp",
        "durable_agents.testing",
        *APPLICATIONS,
    )


# -- the checker itself -------------------------------------------------------------------


def test_relative_imports_resolve_against_the_module_package() -> None:
    source = "from ..llm.base import LLM\nfrom . import _sql\nfrom .base import Store\n"
    found = imports_of(source, "durable_agents.stores.sqlite", is_package=False)
    assert {"durable_agents.llm.base", "durable_agents.stores._sql"} <= found
    assert "durable_agents.stores.base" in found
    package = imports_of("from .d1 import d1_store", "durable_agents.cloudflare", is_package=True)
    assert "durable_agents.cloudflare.d1" in package
    inner = "def f():\n    from ..cloudflare import FetchTransport\n"
    assert "durable_agents.cloudflare" in imports_of(
        inner, "durable_agents.llm._http", is_package=False
    )


def test_the_kit_is_all_there() -> None:
    names = {name for name, _ in kit_modules()}
    assert {
        "durable_agents.run",
        "durable_agents.llm.base",
        "durable_agents.stores.d1",
    } <= names
    assert any(is_core(n) and n.startswith("durable_agents.stores") for n in names)


# -- the kit ------------------------------------------------------------------------------


def test_core_imports_neither_cloudflare_nor_llm_adapters_nor_testing() -> None:
    offenders = {
        name: sorted(
            i
            for i in kit_imports(path, name)
            if within(i, "durable_agents.cloudflare", "durable_agents.testing", *APPLICATIONS)
            or (within(i, "durable_agents.llm") and not within(i, "durable_agents.llm.base"))
        )
        for name, path in kit_modules()
        if is_core(name)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_llm_and_mcp_never_import_cloudflare_testing_or_the_cli() -> None:
    offenders = {
        name: sorted(
            i
            for i in kit_imports(path, name)
            if within(i, "durable_agents.cloudflare", "durable_agents.testing", *APPLICATIONS)
        )
        for name, path in kit_modules()
        if within(name, "durable_agents.llm", "durable_agents.mcp")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_mcp_uses_the_core_plumbing_not_an_llm_adapters() -> None:
    path = KIT / "mcp.py"
    found = kit_imports(path, "durable_agents.mcp")
    assert sorted(i for i in found if within(i, "durable_agents.llm")) == []


def private_owner(imported: str) -> str | None:
    """The package or module a `_private` part of `imported` belongs to (None: all public).

    `durable_agents.stores._limits` -> `durable_agents.stores`; `durable_agents._json`
    -> `durable_agents` (the kit's own shared plumbing, open to all of it)."""
    parts = imported.split(".")
    for k, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:k])
    return None


def test_nothing_imports_another_packages_private_module() -> None:
    offenders = {}
    for name, path in kit_modules():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        bad = [
            i
            for i in kit_imports(path, name)
            if within(i, "durable_agents")
            and (owner := private_owner(i)) is not None
            and not within(package, owner)
        ]
        if bad:
            offenders[name] = sorted(bad)
    assert offenders == {}


def test_the_llm_protocol_module_imports_only_messages() -> None:
    path = KIT / "llm" / "base.py"
    kit_names = {
        i for i in kit_imports(path, "durable_agents.llm.base") if within(i, "durable_agents")
    }
    assert {i for i in kit_names if not within(i, "durable_agents.messages")} == set()


def test_cloudflare_never_imports_testing_or_the_cli() -> None:
    offenders = {
        name: sorted(
            i for i in kit_imports(path, name) if within(i, "durable_agents.testing", *APPLICATIONS)
        )
        for name, path in kit_modules()
        if within(name, "durable_agents.cloudflare")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_in_the_kit_imports_the_user_agent_the_shell_examples_or_test_helpers() -> None:
    outside = ("agent", "entry", "examples", "tests", *sorted(helper_modules()))
    offenders = {
        name: sorted(i for i in kit_imports(path, name) if within(i, *outside))
        for name, path in kit_modules()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


# -- the user's side ----------------------------------------------------------------------


def user_files() -> list[Path]:
    files = [SRC / "agent.py"] if (SRC / "agent.py").exists() else []
    if EXAMPLES.is_dir():
        files += sorted(EXAMPLES.rglob("*.py"))
    return files


def is_agent_module(path: Path) -> bool:
    """What the Worker serves (and bundles): src/agent.py, examples/<name>/agent.py."""
    return path.name == "agent.py"


@pytest.mark.parametrize("path", user_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_user_code_imports_only_the_public_kit(path: Path) -> None:
    if path.is_relative_to(EXAMPLES):
        name = module_name(path, ROOT)
        own = ".".join(name.split(".")[:2])  # examples.<name>: its own package
    else:
        name, own = path.stem, path.stem
    found = imports_of(path.read_text(), name, is_package=path.name == "__init__.py")
    problems = []
    for imported in sorted(found):
        parts = imported.split(".")
        if parts[0] == "durable_agents" and any(p.startswith("_") for p in parts):
            problems.append(f"{imported}: private to the kit")
        if is_agent_module(path) and within(imported, "durable_agents.testing"):
            problems.append(f"{imported}: the testing kit, in a module the Worker serves")
        if within(imported, "examples") and not within(imported, own):
            problems.append(f"{imported}: another example (each example stands alone)")
        if within(imported, "agent", "entry", "tests", *sorted(helper_modules())):
            problems.append(f"{imported}: not part of the kit")
    assert problems == []


def test_src_agent_and_the_examples_are_found() -> None:
    assert EXAMPLES.is_dir(), "examples/ is missing"
    agents = [p for p in user_files() if is_agent_module(p)]
    assert SRC / "agent.py" in agents
    assert len(agents) >= 3  # src/agent.py and at least two examples


# -- no circles ---------------------------------------------------------------------------

RUNTIME = ROOT / "runtime"


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, over the kit (src/) and runtime/*.py (whose
    modules import each other by their bare names). Every import counts: inside
    functions and under TYPE_CHECKING too. `from P import m` with `P.m` a module is
    an arrow to `P.m` only; importing a package's module is not an arrow to the
    package's `__init__` (which every Python package import also runs, and which
    only re-exports)."""
    files = {module_name(p, SRC): p for p in SRC.rglob("*.py")}
    files |= {p.stem: p for p in RUNTIME.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        package = name.split(".") if is_package else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    above = package[: len(package) - node.level + 1]
                    base = ".".join([*above, base] if base else above)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in files else base)
        arrows = set()
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in files:
                parts.pop()
            if parts and ".".join(parts) != name:
                arrows.add(".".join(parts))
        graph[name] = arrows
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_circle_and_only_that() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_kit_or_the_runtime_imports_itself_in_a_circle() -> None:
    graph = module_graph()
    assert {"durable_agents.run", "durable_agents.events", "dev", "deploy_check"} <= set(graph)
    assert cycles(graph) == []
