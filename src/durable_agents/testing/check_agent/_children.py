"""The agents the checked agent's agent tools call (`check_agent(agents=)`), as the check
runs them: each child's tools recorded like the agent's own, TestLLM's arguments for them
made once, and a `LocalAgent` for each run, on the same store (so a crash point can be
any of a child's writes as well as the parent's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...agent import Agent
from ...agent_tools import LocalAgent
from ...errors import ConfigurationError
from ...llm.offline import TestLLM
from ...session_links import agent_tool_agents
from ...stores.base import Store
from ...tools import Tool
from ._recording import Handler, recorded_handler
from ._rules import ToolRules
from ._scenario import Stage

AgentsArg = Mapping[str, Agent[Any, Any] | LocalAgent]
"""`check_agent(agents=)`: what `run(agents=)` takes by name (an `AgentRunner` aside)."""


@dataclass(frozen=True, slots=True)
class ChildAgent:
    """One agent of `agents=`: its tools (with the `LocalAgent`'s handlers), recorded,
    the arguments TestLLM calls them with and the rules its calls are judged by."""

    name: str  # its name in agents= (what agent tools name)
    agent: Agent[Any, Any]
    deps: Any
    tools: dict[str, Tool]
    handlers: dict[str, Handler]
    arguments: dict[str, dict[str, Any]]
    rules: ToolRules
    agent_tools: dict[str, str]  # its own agent tools: tool name -> the agent they run

    def local(self, one_per_step: bool) -> LocalAgent:
        """The `LocalAgent` of one run: TestLLM, and the recorded handlers."""
        llm = TestLLM(one_per_step=one_per_step, arguments=self.arguments)
        return LocalAgent(self.agent, llm=llm, deps=self.deps, tools=self.handlers)

    def counted_as(self, tool: str) -> str:
        """A child tool's name in the report's table: `refunds.refund`."""
        return f"{self.name}.{tool}"

    def report_tools(self) -> list[Tool]:
        return [dataclasses.replace(t, name=self.counted_as(t.name)) for t in self.tools.values()]


def child_agents(
    parent: Agent[Any, Any],
    agents: AgentsArg | None,
    *,
    stage: Stage,
    store: Store,
    made: Callable[[Tool], dict[str, Any]],
) -> dict[str, ChildAgent]:
    """The agents the parent's agent tools call (and theirs, the same `agents=` serving
    every depth, as in `run()`), by name, ready for the check; `ConfigurationError` for
    one `agents=` lacks, or one the check cannot run yet."""
    given = dict(agents or {})
    children = {}
    for name, entry in given.items():
        local = entry if isinstance(entry, LocalAgent) else LocalAgent(entry)
        children[name] = _child(name, local, stage, store, made)
    callers = [(parent.name, agent_tool_agents(parent))] + [
        (name, child.agent_tools) for name, child in children.items()
    ]
    for caller, agent_tools in callers:
        missing = sorted(set(agent_tools.values()) - set(given))
        if missing:
            raise ConfigurationError(
                f"agent {caller!r} has agent tools for {missing}: pass them as "
                "check_agent(..., agents={name: agent}), as run(agents=) takes them, so the "
                "check runs their turns (and crashes in them) too"
            )
    return children


def _child(
    name: str,
    local: LocalAgent,
    stage: Stage,
    store: Store,
    made: Callable[[Tool], dict[str, Any]],
) -> ChildAgent:
    agent = local.agent
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"agents[{name!r}] must be an Agent or a LocalAgent")
    given = dict(local.tools or {})
    tools = {t.name: t.with_handler(given[t.name]) if t.name in given else t for t in agent.tools}
    unsupported = [
        why
        for why, found in (
            ("toolsets", bool(agent.toolsets)),
            ("tools that need approval", any(t.requires_approval for t in tools.values())),
            ("tools without a handler", any(t.handler is None for t in tools.values())),
        )
        if found
    ]
    if unsupported:
        raise ConfigurationError(
            f"check_agent cannot run agent {name!r} of agents= as a child yet: it has "
            f"{' and '.join(unsupported)}"
        )
    return ChildAgent(
        name, agent, local.deps, tools,
        {n: recorded_handler(t, stage, store) for n, t in tools.items()},
        {n: made(t) for n, t in tools.items()},
        ToolRules(tools, {}),
        agent_tool_agents(agent),
    )  # fmt: skip
