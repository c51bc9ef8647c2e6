"""The agents the checked agent's agent tools call (`check_agent(agents=)`), as the check
runs them: each child's tools recorded like the agent's own, TestLLM's arguments for them
made once, and a `LocalAgent` for each run, on the same store (so a crash point can be
any of a child's writes as well as the parent's). A child given as an agent module is set
up as the checked module is (`check_setup`): its env, its dev stubs, its `make_deps`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..._schema.formats import Steer, steered_formats
from ...agent import Agent
from ...agent_tools import LocalAgent, child_session_name
from ...errors import ConfigurationError
from ...llm.offline import TestLLM
from ...session_links import agent_tool_agents
from ...stores.base import Store
from ...tools import Tool
from ._config import CheckEnv, check_setup
from ._recording import Handler, recorded_handler
from ._rules import ToolRules
from ._scenario import Stage

AgentsArg = Mapping[str, Agent[Any, Any] | LocalAgent | ModuleType]
"""`check_agent(agents=)`: what `run(agents=)` takes by name (an `AgentRunner` aside), or
an agent module (`AGENT`, `make_deps`, ...) as `check_agent` takes the checked one."""
MakeArguments = Callable[[Tool, Mapping[str, Steer]], dict[str, Any]]
"""TestLLM's arguments for a tool, made (and checked) once: with a child module's own
`CHECK_AGENT["values"]` steering the formats over the check's."""


@dataclass(frozen=True, slots=True)
class ChildAgent:
    """One agent of `agents=`: its tools (with the `LocalAgent`'s handlers), recorded,
    the arguments TestLLM calls them with and the rules its calls are judged by; for a
    module, what makes its deps each run (`make_deps(env, http)`) and its dev stubs."""

    name: str  # its name in agents= (what agent tools name)
    agent: Agent[Any, Any]
    deps: Any
    tools: dict[str, Tool]
    handlers: dict[str, Handler]
    arguments: dict[str, dict[str, Any]]
    rules: ToolRules
    agent_tools: dict[str, str]  # its own agent tools: tool name -> the agent they run
    make_deps: Callable[..., Any] | None = None  # a module's, called each run
    env: CheckEnv | None = None
    stubs: dict[str, Callable[..., Any]] = field(default_factory=dict)  # placeholder -> stub
    expect_incomplete: frozenset[str] = frozenset()  # a module's CHECK_AGENT, as counted

    def local(self, one_per_step: bool, deps: Any) -> LocalAgent:
        """The `LocalAgent` of one run: TestLLM, the recorded handlers, and `deps` (the
        given ones, or a module's made for the run)."""
        llm = TestLLM(one_per_step=one_per_step, arguments=self.arguments)
        return LocalAgent(self.agent, llm=llm, deps=deps, tools=self.handlers)

    @property
    def gated(self) -> bool:
        return any(t.requires_approval for t in self.tools.values())

    def counted_as(self, tool: str) -> str:
        """A child tool's name in the report's table: `refunds.refund`."""
        return f"{self.name}.{tool}"

    def report_tools(self) -> list[Tool]:
        return [dataclasses.replace(t, name=self.counted_as(t.name)) for t in self.tools.values()]


@dataclass(frozen=True, slots=True)
class ChildSetup:
    """What setting a child up needs from the check: where its tools record, the arguments
    maker, and what a module child's settings come from (as the checked module's)."""

    stage: Stage
    store: Store
    made: MakeArguments
    config: str | os.PathLike[str] | None
    env: Mapping[str, Any] | None


def child_agents(
    parent: Agent[Any, Any], agents: AgentsArg | None, setup: ChildSetup
) -> dict[str, ChildAgent]:
    """The agents the parent's agent tools call (and theirs, the same `agents=` serving
    every depth, as in `run()`), by name, ready for the check; those `agents=` holds that
    no agent tool reaches are left out (`scripts/check` passes every served module).
    `ConfigurationError` for one `agents=` lacks, or one the check cannot run as a child."""
    given = dict(agents or {})
    children: dict[str, ChildAgent] = {}
    callers = [(parent.name, agent_tool_agents(parent))]
    while callers:
        caller, agent_tools = callers.pop(0)
        missing = sorted(set(agent_tools.values()) - set(given))
        if missing:
            raise ConfigurationError(
                f"agent {caller!r} has agent tools for {missing}: pass them as "
                "check_agent(..., agents={name: agent}), as run(agents=) takes them (or "
                "their agent modules), so the check runs their turns (and crashes in them) too"
            )
        for name in dict.fromkeys(agent_tools.values()):
            if name not in children:
                children[name] = child = _child(name, given[name], setup)
                callers.append((name, child.agent_tools))
    return children


def _child(
    name: str, entry: Agent[Any, Any] | LocalAgent | ModuleType, setup: ChildSetup
) -> ChildAgent:
    if isinstance(entry, ModuleType):
        return _module_child(name, entry, setup)
    local = entry if isinstance(entry, LocalAgent) else LocalAgent(entry)
    agent = local.agent
    if not isinstance(agent, Agent):
        raise ConfigurationError(
            f"agents[{name!r}] must be an Agent, a LocalAgent or an agent module"
        )
    given = dict(local.tools or {})
    tools = {t.name: t.with_handler(given[t.name]) if t.name in given else t for t in agent.tools}
    _refuse_what_it_cannot_run(name, agent, tools)
    return ChildAgent(
        name, agent, local.deps, tools,
        {n: recorded_handler(t, setup.stage, setup.store) for n, t in tools.items()},
        {n: setup.made(t, {}) for n, t in tools.items()},
        ToolRules(tools, {}),
        agent_tool_agents(agent),
    )  # fmt: skip


def _module_child(name: str, module: ModuleType, setup: ChildSetup) -> ChildAgent:
    """A child given as its agent module: set up as the checked module is (its env from
    the config's [vars] and `env=`, its dev stubs at placeholders of its own, its
    `CHECK_AGENT` options for its tools), its deps made each run by its `make_deps`."""
    made = check_setup(module, setup.config, setup.env, child=name)
    agent = made.agent
    tools = {t.name: t for t in agent.tools}
    _refuse_what_it_cannot_run(name, agent, tools)
    options = made.options
    given = {n: dict(a) for n, a in options.get("arguments", {}).items()}
    steers = steered_formats(options.get("values"))
    unknown = sorted((set(given) | set(options.get("expect_incomplete", ()))) - set(tools))
    if unknown:
        raise ConfigurationError(
            f"agents[{name!r}]: its CHECK_AGENT names tools it does not have: {unknown} "
            f"(its tools: {sorted(tools)})"
        )
    return ChildAgent(
        name, agent, None, tools,
        {n: recorded_handler(t, setup.stage, setup.store) for n, t in tools.items()},
        {n: given.get(n) or setup.made(t, steers) for n, t in tools.items()},
        ToolRules(tools, {}),
        agent_tool_agents(agent),
        made.make_deps, made.env, made.stubs,
        frozenset(f"{name}.{t}" for t in options.get("expect_incomplete", ())),
    )  # fmt: skip


def _refuse_what_it_cannot_run(
    name: str, agent: Agent[Any, Any], tools: Mapping[str, Tool]
) -> None:
    """`ConfigurationError` for a child the check cannot run: one with toolsets (a child
    turn on CPython, `LocalAgent`, gets no `settings=` or `http=` for them, so it would
    not run as it does in the Worker), or tools without a handler."""
    if agent.toolsets:
        raise ConfigurationError(
            f"check_agent cannot run agent {name!r} of agents= as a child: it has toolsets, "
            "and a child's turn here (LocalAgent) gets no settings= or http= for them. "
            "Check it on its own (check_agent(its module)), and give the checked agent a "
            f"stand-in for {name!r} without toolsets in agents="
        )
    missing = sorted(n for n, t in tools.items() if t.handler is None)
    if missing:
        raise ConfigurationError(
            f"check_agent cannot run agent {name!r} of agents= as a child: its tools "
            f"{missing} have no handler (give them as LocalAgent(..., tools={{...}}))"
        )


async def child_sessions(
    store: Store,
    session_id: str,
    agent_tools: Mapping[str, str],
    children: Mapping[str, ChildAgent],
) -> dict[str, ChildAgent]:
    """Each child session that the agent-tool calls stored in `session_id` ran (and theirs,
    at any depth), with the agent of `agents=` it belongs to."""
    found: dict[str, ChildAgent] = {}
    history = await store.load_messages(session_id)
    for call in (c for m in history for c in m.tool_calls if c.name in agent_tools):
        child = children[agent_tools[call.name]]
        session = child_session_name(session_id, call.id)
        found[session] = child
        found.update(await child_sessions(store, session, child.agent_tools, children))
    return found
