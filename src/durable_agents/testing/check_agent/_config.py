"""What the check reads before it starts: the agent module (`AGENT`, `make_deps`,
`DEV_STUBS`, and `CHECK_AGENT`, the check's options it carries), the settings (the
config's `[vars]` plus `env=`, empty URLs given placeholders), and the servers of the
agent's toolsets. docs/testing.md ("`check_agent`: any agent at every crash point")
describes the env a run gets; "Options the agent module carries", `CHECK_AGENT`."""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ...agent import Agent
from ...errors import ConfigurationError
from ...tools import Toolset


class CheckEnv:
    """A Worker-like env over plain settings: `env.NAME`; a missing name raises AttributeError."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_settings", dict(settings))

    def __getattr__(self, name: str) -> Any:
        settings: dict[str, Any] = object.__getattribute__(self, "_settings")
        if name in settings:
            return settings[name]
        raise AttributeError(
            f"env has no {name!r}: check_agent's env holds the config's [vars] "
            f"({', '.join(sorted(settings)) or 'none'}); "
            f"pass check_agent(..., env={{{name!r}: ...}})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the env is read-only")

    def __dir__(self) -> list[str]:
        return sorted(object.__getattribute__(self, "_settings"))

    def __repr__(self) -> str:
        return f"CheckEnv({sorted(object.__getattribute__(self, '_settings'))})"


@dataclass(frozen=True, slots=True)
class CheckSetup:
    """The agent module's parts and the settings the check runs it with.

    `env`: what `make_deps` gets; `stubs`: placeholder URL -> the module's dev stub
    answering there; `run_settings`: what `run(settings=)` gets (as the Worker passes
    them); `servers`: a toolset's server URL -> that toolset; `options`: the module's
    `CHECK_AGENT` (`arguments`, `values`, `expect_incomplete`), under what the caller
    gives."""

    agent: Agent
    make_deps: Callable[..., Any]
    env: CheckEnv
    stubs: dict[str, Callable[..., Any]]
    run_settings: dict[str, str]
    servers: dict[str, Toolset]
    options: Mapping[str, Any]


def check_setup(
    module: ModuleType | str,
    config: str | os.PathLike[str] | None,
    env: Mapping[str, Any] | None,
    *,
    child: str | None = None,
) -> CheckSetup:
    """Load the agent module and make the settings its runs get. `child`: its name in
    `agents=`, for a module the checked agent's agent tools call (its placeholder URLs
    are its own: two modules' dev stubs for a setting of the same name never meet)."""
    agent, make_deps, stubs, module_file, options = _load(module)
    settings = _settings(config, env, module_file)
    given = dict(settings)
    placeholders, answering = _fill_placeholders(settings, stubs, child)
    # What the Worker passes run(settings=): the values of the settings the toolsets read
    # (an empty one as it is, unless a dev stub answers at its placeholder).
    run_settings = {
        n: str(v)
        for n in agent.settings
        if (v := settings.get(n) if n in stubs else given.get(n)) is not None
    }
    # A toolset's setting left empty that a dev stub answers (`mcp_stub`): the stub is
    # its server, checked as one.
    servers = _toolset_servers(agent, settings, placeholders - set(stubs))
    return CheckSetup(
        agent, make_deps, CheckEnv(settings), answering, run_settings, servers, options
    )


def _fill_placeholders(
    settings: dict[str, Any], stubs: Mapping[str, Callable[..., Any]], child: str | None
) -> tuple[set[str], dict[str, Callable[..., Any]]]:
    """Give an empty `*_URL` setting, or one `DEV_STUBS` names, a placeholder URL (in
    `settings`); the names filled, and the dev stubs by their placeholder."""
    answering = {}
    placeholders = set()
    for name in {*settings, *stubs}:
        value = settings.get(name, "")
        empty = isinstance(value, str) and not value.strip()
        if empty and (name.endswith("_URL") or name in stubs):
            settings[name] = _placeholder(name, child)
            placeholders.add(name)
            if name in stubs:
                answering[settings[name]] = stubs[name]
    return placeholders, answering


def _settings(
    config: str | os.PathLike[str] | None, env: Mapping[str, Any] | None, module_file: str | None
) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if config is not None:
        path = _find_config(Path(config), module_file)
        if not path.is_file():
            raise FileNotFoundError(
                f"check_agent: no config at {path.resolve()}; pass config= (the project's "
                "wrangler.toml) or config=None"
            )
        vars_ = tomllib.loads(path.read_text()).get("vars", {})
        settings.update(vars_)  # as a Worker sees them: strings, or JSON values as they are
    settings.update(env or {})
    return settings


def _find_config(config: Path, module_file: str | None) -> Path:
    """A relative config path from the current directory, else from the nearest folder above
    the agent module that has it (src/agent.py finds the project's wrangler.toml)."""
    if config.is_absolute() or config.exists() or module_file is None:
        return config
    for directory in Path(module_file).resolve().parents:
        if (directory / config).is_file():
            return directory / config
    return config


def _placeholder(name: str, child: str | None) -> str:
    host = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "setting"
    if child is not None:  # a child agent's: https://payments-api-url.refunds.check.invalid
        host += "." + (re.sub(r"[^a-z0-9]+", "-", child.lower()).strip("-") or "agent")
    return f"https://{host}.check.invalid"


def _load(
    module: ModuleType | str,
) -> tuple[Agent, Callable[..., Any], Mapping[str, Any], str | None, Mapping[str, Any]]:
    if isinstance(module, str):
        module = importlib.import_module(module)
    where = getattr(module, "__file__", None) or module.__name__
    agent = getattr(module, "AGENT", None)
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"{where}: AGENT must be an Agent, got {type(agent).__name__}")
    make_deps = getattr(module, "make_deps", None)
    if not callable(make_deps):
        raise ConfigurationError(f"{where}: make_deps(env, http) is missing")
    stubs = getattr(module, "DEV_STUBS", None) or {}
    options = _check_options(getattr(module, "CHECK_AGENT", None), where)
    return agent, make_deps, stubs, getattr(module, "__file__", None), options


CHECK_OPTIONS = {
    "arguments": "{tool name: arguments}",
    "values": "{format or type: value}",
    "expect_incomplete": "a set of tool names",
}


def _check_options(options: object, where: str) -> Mapping[str, Any]:
    """The module's `CHECK_AGENT`: the options of check_agent it carries for its agent
    (what TestLLM cannot guess from its schemas), checked for their names and shapes."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            f"{where}: CHECK_AGENT must be a dict of check_agent's options "
            f"({', '.join(CHECK_OPTIONS)}), got {type(options).__name__}"
        )
    unknown = sorted(str(k) for k in options if k not in CHECK_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"{where}: CHECK_AGENT has {unknown}; it may hold "
            + ", ".join(f"{k!r} ({shape})" for k, shape in CHECK_OPTIONS.items())
        )
    for key in ("arguments", "values"):
        if not isinstance(options.get(key, {}), Mapping):
            raise ConfigurationError(
                f"{where}: CHECK_AGENT[{key!r}] must be {CHECK_OPTIONS[key]}, got "
                f"{type(options[key]).__name__}"
            )
    expected = options.get("expect_incomplete", ())
    names = isinstance(expected, (set, frozenset, list, tuple))
    if not names or not all(isinstance(n, str) for n in expected):
        raise ConfigurationError(
            f"{where}: CHECK_AGENT['expect_incomplete'] must be a set of tool names, got "
            f"{expected!r}"
        )
    return dict(options)


def _toolset_servers(
    agent: Agent, settings: Mapping[str, Any], placeholders: set[str]
) -> dict[str, Toolset]:
    """The servers of the agent's toolsets, whose requests are forwarded (or answered by
    the dev stub at a placeholder): a URL a toolset was given (`MCPTools(url=...)`), or
    that a setting it reads holds (not an empty one the check filled with a placeholder
    no stub answers)."""
    servers: dict[str, Toolset] = {}
    for toolset in agent.toolsets:
        urls = [getattr(toolset, "url", None)]
        urls += [settings.get(n) for n in getattr(toolset, "settings", ()) if n not in placeholders]
        for url in urls:
            if isinstance(url, str) and url.strip().startswith(("http://", "https://")):
                servers.setdefault(url.strip(), toolset)
    return servers
