"""The agents one Worker serves: the default agent (`src/agent.py`, at `/sessions/...`) and
each agent module of `src/agents/` (`src/agents/refunds.py` at `/agents/refunds/sessions/...`).

    SERVED = serve_agents(__file__, import_default, import_named)   # src/entry.py
    SERVED.module("refunds")      # its AgentModule; None: the default agent's
    SERVED.names                  # ("refunds", ...): the served names, sorted

An agent's *served name* is its file's stem, a lower-case Python identifier of at most
32 characters (SERVED_NAME); a file of `src/agents/` with any other stem is refused at
load, naming it. Each module follows the protocol of `agent_module` and is checked by it
(`import_agent`); two modules whose `AGENT.name` is the same are refused too, naming both
files: the sessions table's `agent_name` holds `AGENT.name`, and the listing's filter by
agent (`GET /agents/{agent}/sessions`) maps a served name to it.

Each module is imported when the Worker's entry is (its memory snapshot holds them all).
Deployed, any error stops the Worker at start (Cloudflare refuses the upload). Under the
dev server one module that does not load leaves the others served: its routes answer
500 `agent-not-loaded` with the error, until an edit fixes it.

The object a session lives in is named by `object_name(agent, name)`; a session object
remembers its agent in its storage (`ObjectAgent`), so its alarm serves the same agent.
The guide is docs/several-agents.md; the layout docs/architecture.md.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import ConfigurationError
from .agent_module import DEV_SERVER_NOTE, AgentModule, DevStub, import_agent
from .commands import SERVED_NAME, Command
from .wire import SSE_HEADERS, Reply, error_reply

__all__ = [
    "AGENTS_PACKAGE",
    "AGENTS_PREFIX",
    "AGENT_KEY",
    "SERVED_NAME",
    "ObjectAgent",
    "ServedAgents",
    "check_served_name",
    "clashes",
    "merged_dev_stubs",
    "merged_settings",
    "module_names",
    "object_name",
    "send_to_object",
    "serve_agents",
]

AGENTS_PACKAGE = "agents"  # src/agents/: one agent module per file
AGENTS_PREFIX = "/agents/"  # /agents/{agent}/sessions/...: a served agent's routes
# Where a session object keeps the served name of its agent (none: the default agent).
AGENT_KEY = "durable-agents:agent"


def check_served_name(stem: str, where: str) -> str:
    """`stem` if it is a served name; ConfigurationError naming the file `where` if not."""
    if SERVED_NAME.fullmatch(stem) is None:
        raise ConfigurationError(
            f"{where}: {stem!r} is not an agent's name: the file's name is the agent's name in "
            "URLs (/agents/<name>/sessions/...), 1 to 32 of a-z, 0-9 and '_', starting with a "
            "letter; rename the file"
        )
    return stem


def object_name(agent: str | None, name: str) -> str:
    """The name of the Durable Object of session `name` of the served agent `agent` (None:
    the default agent's, whose objects keep the session's name). `:` is outside the
    session-name alphabet, so no two agents' sessions share an object."""
    return name if agent is None else f"{agent}:{name}"


async def send_to_object(env: Any, name: str, command: Command) -> Reply:
    """`command` to the Durable Object named `name` (`object_name`) of `env.SESSIONS`; its
    answer, the object's SSE passed through untouched (`src/entry.py`'s Worker and its
    objects' agent tools send through it)."""
    stub = env.SESSIONS.getByName(name)
    response = await stub.fetch(
        "https://session.internal/command",
        method="POST",
        body=command.to_json(),
        headers={"content-type": "application/json"},
    )
    content_type = str(response.headers.get("content-type") or "")
    if content_type.startswith("text/event-stream"):
        # passed through untouched: each event reaches the client as the object sends it
        return Reply(int(response.status), None, SSE_HEADERS, stream=response.js_object.body)
    if content_type.startswith("text/html"):  # the timeline page
        return Reply(int(response.status), None, {"content-type": content_type},
                     text=await response.text())  # fmt: skip
    return Reply(int(response.status), await response.json())


def module_names(folder: str) -> list[str]:
    """The served names of the agent modules in `folder` (every `*.py` but `__init__.py`,
    sorted), each checked (`check_served_name`); none if there is no such folder."""
    return [check_served_name(s, os.path.join(folder, f"{s}.py")) for s in _stems(folder)]


def _stems(folder: str) -> list[str]:
    try:
        files = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    return [f[:-3] for f in files if f.endswith(".py") and f != "__init__.py"]


@dataclass(frozen=True, slots=True)
class ServedAgents:
    """The agents a Worker serves: `default` (None where there is no `src/agent.py`), the
    others by served name (`named`), under the dev server only the error of each that did
    not load (`failures`, by served name; None for the default agent), and the dev stubs
    of all (`merged_dev_stubs`)."""

    default: AgentModule | None
    named: Mapping[str, AgentModule] = field(default_factory=dict)
    failures: Mapping[str | None, str] = field(default_factory=dict)
    dev_stubs: Mapping[str, DevStub] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The served names (loaded or not), sorted."""
        return tuple(sorted({*self.named, *(n for n in self.failures if n is not None)}))

    @property
    def none_loaded(self) -> str | None:
        """Where no agent loaded (under the dev server): the first one's error, which the
        Worker answers every request with; else None."""
        if self.default is not None or self.named:
            return None
        return next(iter(self.failures.values()), None)

    def serves(self, agent: str | None) -> bool:
        """Whether `agent` (None: the default agent) is one of these, loaded or not."""
        return agent in self.failures or (
            self.default is not None if agent is None else agent in self.named
        )

    def module(self, agent: str | None) -> AgentModule | None:
        """The module of the served agent `agent` (None: the default), if it loaded."""
        return self.default if agent is None else self.named.get(agent)

    def address(self, path: str) -> tuple[str | None, str] | Reply:
        """The served agent a request's `path` addresses and the path of its routes:
        `/agents/refunds/sessions/x` -> ("refunds", "/sessions/x"), `/sessions/x` -> (None,
        "/sessions/x"); or the answer instead: 404 `unknown-agent` (naming the served
        agents), 500 `agent-not-loaded` (the dev server's, with the module's error)."""
        agent: str | None = None
        if path.startswith(AGENTS_PREFIX):
            agent, slash, rest = path[len(AGENTS_PREFIX) :].partition("/")
            path = slash + rest
            if not self.serves(agent):
                return self.unknown(agent)
            if not path.startswith("/sessions"):
                return error_reply(
                    404, "not-found",
                    f"no endpoint at {AGENTS_PREFIX}{agent}{path[:200]}; the agent's sessions "
                    f"are at {AGENTS_PREFIX}{agent}/sessions/{{name}}",
                )  # fmt: skip
        elif _of_a_session(path) and not self.serves(None):
            return self.unknown(None)
        failure = self.failures.get(agent)
        if failure is not None and (agent is not None or _of_a_session(path)):
            return error_reply(500, "agent-not-loaded", failure)
        return agent, path

    def unknown(self, agent: str | None) -> Reply:
        """404 `unknown-agent`: `agent` (None: the default agent) is not served here."""
        served = ", ".join(f"{AGENTS_PREFIX}{n}/sessions" for n in self.names)
        if self.serves(None):
            served = ", ".join(filter(None, ["/sessions (the default agent)", served]))
        what = (
            "this Worker serves no default agent (no src/agent.py) at /sessions/{name}"
            if agent is None
            else f"this Worker serves no agent {agent[:40]!r}"
        )
        return error_reply(404, "unknown-agent", f"{what}; it serves {served or 'none'}")

    def agent_name(self, agent: str) -> str | None:
        """The `AGENT.name` of the served agent `agent` (what the sessions table holds)."""
        module = self.named.get(agent)
        return None if module is None else module.agent.name

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings of every agent served (`merged_settings`)."""
        modules = [self.default] if self.default is not None else []
        modules += [m for _, m in sorted(self.named.items())]
        return merged_settings(dict(enumerate(modules)))


def _of_a_session(path: str) -> bool:
    """Whether `path` is under one session (`/sessions/{name}...`), not the listing."""
    return path.startswith("/sessions/") and path != "/sessions/"


def merged_dev_stubs(modules: Mapping[str, AgentModule]) -> Mapping[str, DevStub]:
    """Every module's DEV_STUBS in one mapping (`modules`: by the file that names each).
    Two modules may share a setting's stub only if it is the same function: the dev server
    answers `/__dev/<NAME>` with one stub; ConfigurationError naming both files if not."""
    stubs: dict[str, DevStub] = {}
    owner: dict[str, str] = {}
    for where, module in modules.items():
        for name, stub in module.dev_stubs.items():
            if name in stubs and stubs[name] is not stub:
                raise ConfigurationError(
                    f"{where} and {owner[name]} both have a dev stub for {name}, and not the "
                    "same one: the dev server serves one stub per setting; share one function "
                    "(import it from one module) or use a setting each"
                )
            stubs.setdefault(name, stub)
            owner.setdefault(name, where)
    return MappingProxyType(stubs)


def merged_settings(modules: Mapping[Any, AgentModule]) -> tuple[str, ...]:
    """The settings every module reads (SETTINGS, with its toolsets'), each once, in order."""
    return tuple(dict.fromkeys(n for module in modules.values() for n in module.settings))


def clashes(modules: Mapping[str, AgentModule]) -> dict[str, str]:
    """The files of `modules` (by the file that defines each) whose `AGENT.name` another
    one has too, each with the error that says so: the listing tells the agents' sessions
    apart by it, so each served agent needs its own."""
    files: dict[str, list[str]] = {}
    for where, module in modules.items():
        files.setdefault(module.agent.name, []).append(where)
    found: dict[str, str] = {}
    for name, wheres in files.items():
        if len(wheres) > 1:
            message = (
                f"{' and '.join(wheres)} define one agent name, {name!r}: the session listing "
                "tells served agents apart by AGENT.name, so each needs its own"
            )
            found.update(dict.fromkeys(wheres, message))
    return found


def serve_agents(
    entry_file: str,
    import_default: Callable[[], Any],
    import_named: Callable[[str], Any] | None = None,
) -> ServedAgents:
    """The Worker shell's agents: `import_default()` imports `agent.py` beside `entry_file`
    (absent: no default agent), and `import_named(name)` (default: `agents.<name>`) each
    module of the `agents/` folder beside it; each is checked (`import_agent`), and their
    `AGENT.name`s must differ. Deployed, any ConfigurationError propagates (Cloudflare
    refuses a Worker that fails at start); so does serving no agent at all. Under the dev
    server (which stages DEV_SERVER_NOTE beside the entry) each module that does not
    load is left out, its error printed once and kept in `failures`."""
    note = _dev_server_note()
    here = os.path.dirname(entry_file)
    folder = str(getattr(note, "AGENTS_DIR", "src/agents"))
    shown: dict[str | None, str] = {None: str(getattr(note, "AGENT_FILE", "src/agent.py"))}
    importers: dict[str | None, Callable[[], Any]] = {}
    if os.path.exists(os.path.join(here, "agent.py")):
        importers[None] = import_default
    for name in _served_names(os.path.join(here, AGENTS_PACKAGE), folder, note):
        shown[name] = f"{folder}/{name}.py"
        importers[name] = functools.partial(import_named or _import_named, name)
    if not importers:
        raise ConfigurationError(
            "no agent to serve: write src/agent.py (the default agent) or a module in "
            "src/agents/ (served at /agents/<its name>/sessions/...)"
        )
    loaded: dict[str | None, AgentModule] = {}
    failures: dict[str | None, str] = {}
    for agent, importer in importers.items():
        file = os.path.join(here, "agent.py" if agent is None else f"{AGENTS_PACKAGE}/{agent}.py")
        try:
            loaded[agent] = import_agent(
                importer, file, shown_as=shown[agent],
                packages=getattr(note, "PACKAGES", None), excluded=getattr(note, "EXCLUDED", None),
            )  # fmt: skip
        except ConfigurationError as exc:
            until = "Until it loads, its routes answer every request with this error"
            failures[agent] = _left_out(exc, note, until)
    clash = clashes({shown[a]: m for a, m in loaded.items()})
    for agent in [a for a in loaded if shown[a] in clash]:
        error = ConfigurationError(clash[shown[agent]])
        failures[agent] = _left_out(error, note, "Until then it is not served")
        del loaded[agent]
    # One stub per setting for all (a deploy refuses two that differ, as scripts/dev does).
    stubs = merged_dev_stubs({shown[a]: m for a, m in loaded.items()})
    default = loaded.pop(None, None)
    named = {n: m for n, m in loaded.items() if n is not None}
    return ServedAgents(default, MappingProxyType(named), MappingProxyType(failures), stubs)


def _served_names(path: str, folder: str, note: Any) -> list[str]:
    """The served names of the modules at `path` (shown as `folder`); a stem that is none
    stops a deployed Worker, and is left out under the dev server (`note`)."""
    names = []
    for stem in _stems(path):
        try:
            names.append(check_served_name(stem, f"{folder}/{stem}.py"))
        except ConfigurationError as exc:
            _left_out(exc, note, "Until it is renamed, it is not served")
    return names


def _left_out(exc: ConfigurationError, note: Any, until: str) -> str:
    """Deployed (no `note`): raise `exc`. Under the dev server: say it, and `until` when."""
    if note is None:
        raise exc
    print(f"{exc}. {until}")
    return str(exc)


def _dev_server_note() -> Any:
    try:
        return importlib.import_module(DEV_SERVER_NOTE)
    except ModuleNotFoundError as exc:
        if exc.name != DEV_SERVER_NOTE:
            raise
        return None


def _import_named(name: str) -> Any:
    return importlib.import_module(f"{AGENTS_PACKAGE}.{name}")


class ObjectAgent:
    """Which served agent a session object serves: the one its commands name (remembered in
    its storage under AGENT_KEY, once per instance), so that its alarm, and a command that
    names none (the retention cron's delete), serve the same agent. None: the default
    agent, whose objects remember nothing."""

    def __init__(self, storage_of: Callable[[], Any]) -> None:
        self._storage_of = storage_of
        self._known: str | None = None
        self._read = False

    async def of(self, agent: str | None) -> str | None:
        """The agent to serve a command naming `agent` with; remembered if new."""
        if agent is None:
            return await self.remembered()
        if agent != self._known:
            await self._storage_of().put(AGENT_KEY, agent)
            self._known, self._read = agent, True
        return agent

    async def remembered(self) -> str | None:
        """The agent this object's commands named (None: the default agent, or none yet)."""
        if not self._read:
            stored = await self._storage_of().get(AGENT_KEY)
            self._known = stored if isinstance(stored, str) else None
            self._read = True
        return self._known
