"""A failed check as `check_agent` raises it, saying whose rule broke: the agent's (its
tools, their declarations, `make_deps`, a toolset of its own) or the kit's. The two kinds
are described in docs/testing.md ("Arguments, crash points, and who broke what")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from ...mcp import MCPTools
from ...messages import Message
from ...tools import Toolset
from ._check_history import format_history
from ._scenario import Scenario

Blame = Literal["agent", "kit"]


class AgentBreach(AssertionError):
    """A check failed on something the agent decides (a tool's declaration, a handler)."""


def toolset_name(toolset: object) -> str:
    """A toolset in a message: its repr, or its class's name when it has no repr of its own."""
    if type(toolset).__repr__ is object.__repr__:
        return type(toolset).__name__
    return repr(toolset)


def toolset_fault(servers: Mapping[str, Toolset], server: str, what: str) -> AssertionError:
    """A toolset's mistake: the kit's when it is the kit's own `MCPTools`, else the
    agent's (a toolset of its own, or a wrapper)."""
    toolset = servers.get(server)
    if type(toolset) is MCPTools:
        return AssertionError(f"{what} (toolset {toolset!r})")
    return AgentBreach(f"{what} (toolset {toolset_name(toolset)}, the agent's own)")


def breach(
    agent_name: str,
    scenario: Scenario,
    what: str,
    history: Sequence[Message],
    *,
    blame: Blame = "kit",
    own_store: bool = False,
) -> AssertionError:
    """The failure, naming the crash point and whose rule broke, with the stored history
    and the requests of the scenario. `own_store`: the check ran on a store given as
    `store=`, which may be the culprit as well."""
    where = f"after {scenario.crash}" if scenario.crash else "without a crash"
    requests = "\n".join(f"    {r}" for r in scenario.requests) or "    (none)"
    if blame == "agent":
        rule = f"your agent broke a rule: {what}"
    elif own_store:
        rule = (
            "the kit, or the store given as store=, broke a rule (check_agent cannot tell "
            f"them apart): {what} — please report this if that store is the kit's own"
        )
    else:
        rule = f"the kit broke a rule: {what} — please report this"
    return AssertionError(
        f"check_agent: agent {agent_name!r}, TestLLM({scenario.mode}), {where}, "
        f"session {scenario.name!r}:\n  {rule}\n"
        f"  stored history:\n{format_history(history)}\n  requests:\n{requests}"
    )
