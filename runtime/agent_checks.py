"""The agent module as the Worker reads it, loaded on CPython, and what it needs before a
turn can run: a model its settings can make (`model_problem`) and the settings its
toolsets read (`toolset_settings`). Shared by the dev server (runtime/dev.py, which stops
at start when a turn would fail) and the deploy check (runtime/deploy_check.py, which
names what Cloudflare lacks); docs/dev-server.md and docs/deploy.md say what each tells.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
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


def load_agent(agent_file: Path, src: Path = PROJECT / "src") -> Any:
    """The agent module at `agent_file` as the Worker reads it (`AgentModule.load`), imported
    on CPython as `agent` with `src` (the kit) importable. Raises what the import raises."""
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    spec = importlib.util.spec_from_file_location("agent", agent_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {agent_file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["agent"] = module
    spec.loader.exec_module(module)
    from durable_agents.cloudflare.agent_module import AgentModule

    return AgentModule.load(module)


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
