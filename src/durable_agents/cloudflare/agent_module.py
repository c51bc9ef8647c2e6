"""The user's agent module (`src/agent.py`), as the Worker shell reads it.

A Worker built on the kit serves one agent, defined in one module that
`src/entry.py` imports as `agent`:

    AGENT: Agent                      required: the agent every session runs
    make_deps(env, http) -> Any       required: what its handlers get as `ctx.deps`.
                                      `env` is the Worker's env (attribute access,
                                      `env.MY_SETTING`); `http` is an `httpx.AsyncClient`
                                      that works in the Worker (over `fetch`) and on
                                      CPython. Handlers must use it: a plain httpx
                                      client cannot open sockets in a Worker.
    make_llm(env) -> LLM              optional; default `llm_from_env(env)`
    SETTINGS: tuple[str, ...]         optional: the names of the settings it reads; the
                                      dev server passes them from the environment and
                                      prints them. Those its toolsets read
                                      (`MCPTools(url_setting="MCP_URL")`) are added
    DEV_STUBS: {name: stub}           optional: for the dev server only. A setting
                                      `name` left empty is pointed at
                                      `<dev server>/__dev/<name>`, and the Worker
                                      answers requests there with `stub`.

A stub is `stub(method, path, body, headers) -> (status, json_body)`, sync
or async: `path` is what follows `/__dev/<name>`, with the query string if
the request had one ("/orders/42", "/slots?date=2026-12-03", or "/" for the
URL itself), `body` the raw request body, `headers` the request's
headers with lower-case names (an `Idempotency-Key` arrives as
`headers["idempotency-key"]`); `json_body` None sends no body (a 202).
The Worker serves `/__dev/...` only while its setting `DEV_STUBS` is
`"on"`, which only the dev server sets; on Cloudflare those paths are 404s
like any unknown path.

For the server of `MCPTools(url_setting="MCP_URL")`, `DEV_STUBS = {"MCP_URL":
durable_agents.mcp.mcp_stub(*tools)}`: an MCP server of the kit's own tools,
so an agent with MCP tools runs offline (docs/mcp.md).

`AgentModule.load(module)` checks a module against this protocol and says
what is missing, in terms of the module's own file; `import_agent` imports it
first and turns whatever the import raises into the same kind of error, naming
the file, the line and the fix (`explain_load_error`: a package the Worker
lacks and the command that adds it, a name an annotation uses that the module
does not define). The Worker answers every request with that error under the
dev server, which keeps running (docs/dev-server.md); a deploy refuses it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx
from pydantic import BaseModel

from ..agent import Agent
from ..errors import ConfigurationError
from ..llm.base import LLM
from ..llm.settings import llm_from_env
from .load_errors import explain_load_error

__all__ = [
    "DEV_SERVER_NOTE",
    "DEV_STUB_PREFIX",
    "AgentModule",
    "DevStub",
    "MakeDeps",
    "MakeLLM",
    "explain_load_error",
    "import_agent",
    "serve_agent",
]

MakeDeps = Callable[[Any, httpx.AsyncClient], Any]
MakeLLM = Callable[[Any], LLM]
DevStub = Callable[
    [str, str, bytes, Mapping[str, str]], tuple[int, Any] | Awaitable[tuple[int, Any]]
]
DEV_STUB_PREFIX = "/__dev/"
# The module the dev server stages beside the Worker's entry (runtime/dev.py): AGENT_FILE,
# the agent file's own path, and PACKAGES, the packages providing modules .venv has and
# python_modules/ lacks. A deployed Worker has none.
DEV_SERVER_NOTE = "_durable_agents_dev"
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class AgentModule:
    """What the Worker serves: an agent and the functions that set it up per turn.

    Build it with `AgentModule.load(module)` from a module following the
    protocol above, or directly (tests of the Worker's own HTTP API do).
    """

    agent: Agent
    make_deps: MakeDeps
    make_llm: MakeLLM = llm_from_env
    settings: tuple[str, ...] = ()
    dev_stubs: Mapping[str, DevStub] = field(default_factory=dict)

    @classmethod
    def load(cls, module: Any, where: str | None = None) -> AgentModule:
        """Read `AGENT`, `make_deps`, `make_llm`, `SETTINGS` and `DEV_STUBS` from `module`.

        Raises `ConfigurationError` naming the module's file (`where`, default its
        `__file__`) and what is missing or of the wrong kind, or the line of a model
        of the module whose annotations name something it does not define.
        """
        if where is None:
            where = str(getattr(module, "__file__", None) or getattr(module, "__name__", module))
        agent = getattr(module, "AGENT", None)
        if not isinstance(agent, Agent):
            got = "nothing" if agent is None else type(agent).__name__
            raise ConfigurationError(
                f"{where} must define AGENT, the Agent the Worker serves "
                f"(AGENT = Agent(name, instructions, [tools])); found {got}"
            )
        make_deps = _function(module, "make_deps", "(env, http)", 2, where)
        if make_deps is None:
            raise ConfigurationError(
                f"{where} must define make_deps(env, http): what the tools get as ctx.deps "
                "(return None if they need nothing)"
            )
        make_llm = _function(module, "make_llm", "(env)", 1, where) or llm_from_env
        _complete_models(module, where)
        return cls(
            agent,
            make_deps,
            make_llm,
            _settings(getattr(module, "SETTINGS", ()), where, agent.settings),
            _dev_stubs(getattr(module, "DEV_STUBS", None), where),
        )

    @property
    def has_own_llm(self) -> bool:
        """Whether the module defines `make_llm` (else `llm_from_env` builds the LLM)."""
        return self.make_llm is not llm_from_env

    def describe(self) -> dict[str, Any]:
        """What the dev server needs to know, as JSON-ready data (it knows no agent itself)."""
        return {
            "agent": self.agent.name,
            "settings": list(self.settings),
            "dev_stubs": list(self.dev_stubs),
            "make_llm": self.has_own_llm,
        }


def _function(module: Any, name: str, parameters: str, arity: int, where: str) -> Any:
    value = getattr(module, name, None)
    if value is None:
        return None
    if not callable(value):
        raise ConfigurationError(f"{where}: {name} must be a function {name}{parameters}")
    try:
        inspect.signature(value).bind(*([None] * arity))
    except TypeError:
        raise ConfigurationError(f"{where}: {name} must take {parameters}") from None
    except ValueError:  # a builtin without a signature: take it as it is
        pass
    return value


def _settings(value: Any, where: str, toolsets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`SETTINGS` as names, then those the agent's toolsets read (`MCPTools(url_setting=)`)
    that it does not list itself."""
    if isinstance(value, str) or not isinstance(value, tuple | list | frozenset | set):
        raise ConfigurationError(
            f'{where}: SETTINGS must be a tuple of setting names, e.g. ("MY_API_URL",)'
        )
    names = tuple(_setting_name(name, "SETTINGS", where) for name in value)
    return names + tuple(name for name in toolsets if name not in names)


def _dev_stubs(value: Any, where: str) -> Mapping[str, DevStub]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{where}: DEV_STUBS must map setting names to stub functions "
            "(method, path, body, headers) -> (status, json_body)"
        )
    stubs: dict[str, DevStub] = {}
    for name, stub in value.items():
        _setting_name(name, "DEV_STUBS", where)
        if not callable(stub):
            raise ConfigurationError(f"{where}: DEV_STUBS[{name!r}] must be a function")
        stubs[name] = stub
    return MappingProxyType(stubs)


def _setting_name(name: Any, where_in: str, where: str) -> str:
    if not isinstance(name, str) or not _SETTING_NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where}: {where_in} holds {name!r}, which is not a setting name "
            "(letters, digits and '_')"
        )
    return name


def import_agent(
    importer: Callable[[], Any],
    file: str,
    *,
    shown_as: str | None = None,
    packages: Mapping[str, str] | None = None,
    excluded: Mapping[str, str] | None = None,
) -> AgentModule:
    """The agent module that `importer()` imports from `file`, loaded (`AgentModule.load`).

    Use it rather than `AgentModule.load` where the import itself may fail: anything
    the import raises, and a breach of the protocol, becomes a `ConfigurationError`
    (chained to the original) that names the file as `shown_as` (default `file`), the
    line, what failed and the fix (`explain_load_error`; `packages` maps an import
    name to the package that provides it; `excluded`, a module name to the pattern of
    wrangler.toml's `[python_modules] exclude` leaving it out). The Worker shell
    (`src/entry.py`) imports `src/agent.py` with it, and the dev server does on CPython.
    """
    shown = shown_as or file
    try:
        module = importer()
    except Exception as exc:
        raise ConfigurationError(explain_load_error(exc, file, shown, packages, excluded)) from exc
    return AgentModule.load(module, shown)


def serve_agent(importer: Callable[[], Any], entry_file: str) -> tuple[AgentModule, str | None]:
    """The Worker shell's agent: `importer()` imports `agent.py` beside `entry_file`, and
    `import_agent` checks it. Deployed, its ConfigurationError propagates: a Worker that
    fails at start is refused by Cloudflare, and the running version stays. Under the
    dev server (which stages DEV_SERVER_NOTE beside the entry) the Worker starts anyway:
    a stand-in agent and the error's message, printed once here, for every request to
    be answered with, until a fixed module reloads the Worker."""
    try:
        note: Any = importlib.import_module(DEV_SERVER_NOTE)
    except ModuleNotFoundError as exc:
        if exc.name != DEV_SERVER_NOTE:
            raise
        note = None
    try:
        served = import_agent(
            importer,
            os.path.join(os.path.dirname(entry_file), "agent.py"),
            shown_as=getattr(note, "AGENT_FILE", "src/agent.py"),
            packages=getattr(note, "PACKAGES", None),
            excluded=getattr(note, "EXCLUDED", None),
        )
    except ConfigurationError as exc:
        if note is None:
            raise
        print(f"{exc}. Until it loads, the Worker answers every request with this error")
        return AgentModule(Agent("agent-not-loaded"), _no_deps), str(exc)
    return served, None


def _no_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None


def _complete_models(module: Any, where: str) -> None:
    """Build each pydantic model the module defines that is not complete yet: an annotation
    naming what the module does not define leaves a model so, to fail at its first use,
    in a turn; here it fails at once, with the annotation's line."""
    namespace = dict(vars(module))
    for value in namespace.values():
        if not (
            isinstance(value, type)
            and issubclass(value, BaseModel)
            and value.__module__ == getattr(module, "__name__", None)
            and not value.__pydantic_complete__
        ):
            continue
        try:
            value.model_rebuild(_types_namespace=namespace)
        except Exception as exc:
            file = str(getattr(module, "__file__", None) or where)
            raise ConfigurationError(explain_load_error(exc, file, where)) from exc
