"""The agent module as the Worker reads it, loaded on CPython, and what it needs before a
turn can run: a model its settings can make (`model_problem`), the settings its
toolsets read (`toolset_settings`), and the modules it imports that the Worker's
packages (python_modules/) lack (`modules_the_worker_lacks`). Shared by the dev server
(runtime/dev.py, which stops at start when a turn would fail) and the deploy check
(runtime/deploy_check.py, which names what Cloudflare lacks); docs/dev-server.md and
docs/deploy.md say what each tells.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
# The kit's settings whose values are secrets: the dev server never prints them, a deploy
# keeps them out of [vars].
SECRET_SETTINGS = ("API_TOKEN", "LLM_API_KEY", "SESSION_TOKEN_SECRET")
# Settings a failing `make_llm` is tried again with (a placeholder value), to name the one
# it lacks: llm_from_env's keys (anthropic, openai at api.openai.com).
MODEL_KEYS = ("LLM_API_KEY",)


def load_agent(
    agent_file: Path,
    src: Path = PROJECT / "src",
    packages: Mapping[str, str] | None = None,
    module_name: str = "agent",
) -> Any:
    """The agent module at `agent_file` as the Worker reads it, imported on CPython as
    `module_name` (`agents.<name>` for one of src/agents/) with `src` (the kit) importable.
    Raises the kit's ConfigurationError naming the file, the line, what failed and the fix
    (`import_agent`), chained to what the import raised; `packages` maps an import name to
    the package that provides it."""
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    from durable_agents.cloudflare.agent_module import import_agent

    def load() -> Any:
        spec = importlib.util.spec_from_file_location(module_name, agent_file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {agent_file} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        importlib.invalidate_caches()  # a package installed into .venv since the last load
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return module

    return import_agent(load, str(agent_file), shown_as=shown_path(agent_file), packages=packages)


@dataclass(frozen=True, slots=True)
class ServedModules:
    """The agent modules a Worker serves, loaded on CPython (`load_served`), by served name
    (None: the default agent, src/agent.py): `modules` those that load, `files` each one's
    file, `failures` the error of each that does not. What the dev server and the deploy
    check read of one module (`settings`, `dev_stubs`, `agent`, `has_own_llm`) is here
    for them all."""

    modules: dict[str | None, Any]
    files: dict[str | None, Path]
    failures: dict[str | None, str]

    @property
    def settings(self) -> tuple[str, ...]:
        names = (n for m in self.modules.values() for n in m.settings)
        return tuple(dict.fromkeys(names))

    @property
    def dev_stubs(self) -> Mapping[str, Any]:
        """Every module's DEV_STUBS; ConfigurationError for two that differ on a setting."""
        from durable_agents.cloudflare.served_agents import merged_dev_stubs

        return merged_dev_stubs({shown_path(self.files[a]): m for a, m in self.modules.items()})

    @property
    def has_own_llm(self) -> bool:
        return any(m.has_own_llm for m in self.modules.values())

    @property
    def agent(self) -> Any:
        """The agents' names and toolsets, as one agent's (the banner, the toolset check)."""
        agents = [m.agent for m in self.modules.values()]
        name = ", ".join(a.name for a in agents) or "agent-not-loaded"
        return SimpleNamespace(name=name, toolsets=[t for a in agents for t in a.toolsets])

    def paths(self, origin: str) -> list[str]:
        """Where each agent is served: `<origin>/sessions/...` for the default one."""
        return [
            f"agent {m.agent.name} ({shown_path(self.files[a])}): {origin}"
            f"{'' if a is None else f'/agents/{a}'}/sessions/{{name}}"
            for a, m in self.modules.items()
        ]


def agent_files(agent_file: Path | None, agents_dir: Path | None) -> dict[str | None, Path]:
    """The agent modules a Worker serves, by served name (None: `agent_file`, the default
    agent, where it exists): each `*.py` of `agents_dir` but `__init__.py`, by its stem."""
    files: dict[str | None, Path] = {}
    if agent_file is not None and agent_file.is_file():
        files[None] = agent_file
    if agents_dir is not None and agents_dir.is_dir():
        files.update((p.stem, p) for p in sorted(agents_dir.glob("*.py")) if p.stem != "__init__")
    return files


def load_served(
    files: Mapping[str | None, Path],
    src: Path = PROJECT / "src",
    packages: Mapping[str, str] | None = None,
) -> ServedModules:
    """Each agent module of `files` (`agent_files`) loaded (`load_agent`) as the Worker loads
    it: a file name that is no agent's name, a module that does not load and two of one
    AGENT.name each leave that one out, its error in `failures`."""
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    from durable_agents.cloudflare.served_agents import check_served_name, clashes
    from durable_agents.errors import ConfigurationError

    modules: dict[str | None, Any] = {}
    failures: dict[str | None, str] = {}
    for agent, file in files.items():
        try:
            if agent is not None:
                check_served_name(agent, shown_path(file))
            name = "agent" if agent is None else f"agents.{agent}"
            modules[agent] = load_agent(file, src, packages, name)
        except ConfigurationError as exc:
            failures[agent] = str(exc)
    clash = clashes({shown_path(files[a]): m for a, m in modules.items()})
    for agent in [a for a in modules if shown_path(files[a]) in clash]:
        failures[agent] = clash[shown_path(files[agent])]
        del modules[agent]
    return ServedModules(modules, dict(files), failures)


def shown_path(path: Path) -> str:
    """`path` as messages name it: relative to the project when in it (src/agent.py)."""
    return str(path.relative_to(PROJECT)) if path.is_relative_to(PROJECT) else str(path)


class _Binding:
    """Stands for a binding while a model is made: it has every method (none is called)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


@dataclass(frozen=True, slots=True)
class ModelProblem:
    """Why the agent's model cannot be made: `message` (the ConfigurationError's) and
    `missing`, the setting that would fix it (None if no missing key would)."""

    message: str
    missing: str | None


def model_problem(
    make_llm: Callable[[Any], Any], settings: Mapping[str, str], bindings: Sequence[str] = ()
) -> ModelProblem | None:
    """Call `make_llm` with an env of `settings` (and a placeholder per binding) as the
    Worker does for each turn; None if it makes a model, or fails with anything but the
    kit's ConfigurationError (a make_llm that needs the Workers runtime: the Worker tells).
    Nothing is contacted: building an LLM opens no connection."""
    from durable_agents.errors import ConfigurationError

    def fails(values: Mapping[str, str]) -> ConfigurationError | None:
        env = SimpleNamespace(**{name: _Binding() for name in bindings}, **values)
        try:
            make_llm(env)
        except ConfigurationError as exc:
            return exc
        except Exception:
            return None
        return None

    error = fails(settings)
    if error is None:
        return None
    for name in MODEL_KEYS:
        if not str(settings.get(name) or "").strip() and fails({**settings, name: "set"}) is None:
            return ModelProblem(str(error), name)
    return ModelProblem(str(error), None)


def toolset_settings(agent: Any) -> dict[str, str]:
    """The settings the agent's toolsets read (each toolset's `settings`), each with the
    toolset that reads it first (its repr, `MCPTools(url_setting='MCP_URL', name=None)`):
    a toolset refuses every turn while a setting of its own is missing or empty."""
    found: dict[str, str] = {}
    for toolset in agent.agent.toolsets:
        for name in getattr(toolset, "settings", ()):
            found.setdefault(name, repr(toolset))
    return found


# Modules the Worker has without python_modules/: Pyodide's own, and the standard library
# of its CPython 3.14 (this process's list, plus what 3.12-3.14 added).
PYODIDE_MODULES = frozenset(
    {"js", "pyodide", "pyodide_js", "_pyodide", "annotationlib", "compression"}
)


def excluded_modules(patterns: Iterable[str]) -> dict[str, str]:
    """Module name -> the pattern of wrangler.toml's `[python_modules] exclude` that leaves
    it out of the Worker, for the patterns that name a whole package or module
    (`anyio/**` -> `anyio`, `pydantic/color.py` -> `pydantic.color`): the Worker cannot
    import it, although python_modules/ has it."""
    found: dict[str, str] = {}
    for pattern in patterns:
        path = str(pattern).removesuffix("/**").removesuffix(".py")
        if path and not re.search(r"[*?\[\]]", path) and not path.startswith((".", "/")):
            found[path.replace("/", ".")] = str(pattern)
    return found


@dataclass(frozen=True, slots=True)
class MissingModule:
    """A module the agent's files import (`module`, its top-level name, at `file`:`line`)
    that neither src/, the standard library, Pyodide nor python_modules/ has; `package`,
    the package that provides it in this Python (.venv), if it does; `excluded`, the
    pattern of wrangler.toml's `[python_modules] exclude` that leaves it out of the Worker
    when python_modules/ has it."""

    module: str
    file: Path
    line: int
    package: str | None
    excluded: str | None = None

    def describe(self) -> str:
        """The warning the dev server prints, with the fix."""
        where = f"{shown_path(self.file)}, line {self.line}, imports `{self.module}`"
        if self.excluded is not None:
            return (
                f"{where}, which python_modules/ has but wrangler.toml's [python_modules] "
                f"exclude leaves out of the Worker ({self.excluded!r}): delete that entry"
            )
        lacks = "which the Worker's packages (python_modules/) lack"
        if self.package is None:
            return (
                f"{where}, {lacks} (and .venv has no package providing it): if it comes from "
                "a package, add that package with `scripts/add-package <its name on PyPI>`; "
                "a module of your own goes in src/"
            )
        return f"{where}, {lacks}: add it with `scripts/add-package {self.package}`"


def modules_the_worker_lacks(
    modules: Mapping[str, Path],
    python_modules: Path,
    packages: Callable[[Iterable[str]], Mapping[str, str]],
    excluded: Mapping[str, str] | None = None,
) -> list[MissingModule]:
    """The imports of the Worker's `modules` (by dotted name; the kit's own, `durable_agents`
    and `entry`, are not looked at) that nothing the Worker has provides: `modules`
    themselves, the standard library, Pyodide, python_modules/. Imports under `if
    TYPE_CHECKING:` or in a `try` that catches ImportError are left out. `packages(names)`
    maps the missing import names to their packages (`packages_providing`), asked only if
    one is missing; `excluded` (`excluded_modules`), what wrangler.toml leaves out of
    python_modules/'s upload. None when python_modules/ is not there (set-up has not run)."""
    if not python_modules.is_dir():
        return []
    excluded = excluded or {}
    left_out = {name for name in excluded if "." not in name}
    have = {name.split(".")[0] for name in modules} | (vendored_names(python_modules) - left_out)
    have |= set(sys.stdlib_module_names) | PYODIDE_MODULES
    found: dict[str, tuple[Path, int]] = {}
    for name, path in modules.items():
        if name == "entry" or name.split(".")[0] == "durable_agents":
            continue
        for module, line in unguarded_imports(path):
            if module not in have:
                found.setdefault(module, (path, line))
    if not found:
        return []
    from durable_agents.cloudflare.load_errors import excluded_by

    provides = packages(found)
    return [
        MissingModule(m, f, n, provides.get(m), excluded_by(m, excluded))
        for m, (f, n) in found.items()
    ]


def vendored_names(python_modules: Path) -> set[str]:
    """The top-level modules and packages of python_modules/."""
    names = set()
    for path in python_modules.iterdir():
        if path.is_dir() and "." not in path.name and path.name != "__pycache__":
            names.add(path.name)
        elif path.suffix in (".py", ".so"):
            names.add(path.name.split(".")[0])
    return names


def unguarded_imports(path: Path) -> Iterator[tuple[str, int]]:
    """The top-level names of the absolute imports of the module at `path`, with their
    lines: not under `if TYPE_CHECKING:`, not in a `try` catching ImportError."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return
    yield from _imports_of(tree.body)


def _imports_of(nodes: Iterable[ast.AST]) -> Iterator[tuple[str, int]]:
    for node in nodes:
        if isinstance(node, ast.If) and re.search(r"\bTYPE_CHECKING\b", ast.unparse(node.test)):
            yield from _imports_of(node.orelse)
        elif isinstance(node, ast.Try | ast.TryStar):
            guarded = any(_catches_import_error(h.type) for h in node.handlers)
            for part in ([] if guarded else [node.body]) + [node.orelse, node.finalbody]:
                yield from _imports_of(part)
            for handler in node.handlers:
                yield from _imports_of(handler.body)
        elif isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.module.split(".")[0], node.lineno
        else:
            yield from _imports_of(ast.iter_child_nodes(node))


def _catches_import_error(kind: ast.expr | None) -> bool:
    names = re.findall(r"\w+", ast.unparse(kind)) if kind is not None else ["BaseException"]
    return bool({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & set(names))


def packages_providing(site_folders: Iterable[str] | None = None) -> dict[str, str]:
    """Import name -> the package (normalized name) providing it, for the packages installed
    in this Python (.venv): `{"yaml": "pyyaml", ...}`. Read from each `*.dist-info` folder's
    top_level.txt, else its RECORD (~0.15 s; importlib.metadata's packages_distributions
    takes 0.6-0.9 s, parsing every package's metadata)."""
    found: dict[str, str] = {}
    folders = [f for f in (sys.path if site_folders is None else site_folders) if f]
    for folder in folders:
        if not folder.endswith("site-packages") or not Path(folder).is_dir():
            continue
        for info in sorted(Path(folder).glob("*.dist-info")):
            package = re.sub(r"[-_.]+", "-", info.name.split("-")[0]).lower()
            for name in _top_level_names(info):
                found.setdefault(name, package)
    return found


def _top_level_names(info: Path) -> set[str]:
    top_level = info / "top_level.txt"
    try:
        if top_level.is_file():
            lines = top_level.read_text().split()
        else:
            lines = [
                row.split(",")[0].split("/")[0]
                for row in (info / "RECORD").read_text().splitlines()
            ]
    except OSError:
        return set()
    names = {line.split(".")[0] for line in lines}
    return {n for n in names if n.isidentifier() and not n.startswith("__")}
