"""A failed check as `check_agent` raises it, saying whose rule broke: the agent's (its
tools, their declarations, `make_deps`, a toolset of its own) or the kit's. The two kinds
are described in docs/testing.md ("Arguments, crash points, and who broke what"); a side
effect that never completed in "The report: how far each tool got"."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ...mcp import MCPTools
from ...messages import Message
from ...tools import Tool, Toolset
from ._check_history import format_history
from ._report import AgentCheckReport, ToolCounts
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


def never_completed(
    report: AgentCheckReport, tools: Mapping[str, Tool], arguments: Mapping[str, Any]
) -> AssertionError:
    """The failure of a check whose side effects (`report.never_completed`) never
    completed: each named, with what its runs ended in, TestLLM's arguments for it and
    the ways to fix it; then the tools' table."""
    lines = [f"check_agent: agent {report.agent!r}:"]
    for name in report.never_completed:
        counts = report.tools[name]
        lines.append(
            f"  your agent broke a rule: tool {name!r} is a side effect (not safe_to_retry) "
            f"and its handler never completed in the check ({counts.ended_in()}), so the "
            "check never saw it act and cannot vouch for it"
        )
        made = arguments.get(name)
        if made is not None:
            lines.append(f"    TestLLM called it with {json.dumps(made, ensure_ascii=False)}")
        lines.append(
            "    to fix it: " + ";\n      or ".join(_fixes(name, tools.get(name), counts, made))
        )
    lines += ['  tools (docs/testing.md, "The report: how far each tool got"):', report.table()]
    return AssertionError("\n".join(lines))


def _fixes(name: str, t: Tool | None, counts: ToolCounts, made: Any) -> list[str]:
    """The ways to make `name` complete in the check, the likeliest first."""
    fixes = []
    formats = sorted(_formats(t.input_schema)) if t is not None else []
    dates = [f for f in ("date-time", "date") if f in formats]
    if dates:
        steer = ", ".join(f'{json.dumps(f)}: "future"' for f in dates)
        fixes.append(
            f"steer the values TestLLM makes: check_agent(module, values={{{steer}}}) (a week "
            "after now; or a value, or a function of now)"
        )
    elif formats:
        fixes.append(
            f"steer the values TestLLM makes for its formats ({', '.join(formats)}): "
            f"check_agent(module, values={{{json.dumps(formats[0])}: ...}})"
        )
    given = json.dumps(made, ensure_ascii=False) if made is not None else "{...}"
    template = f"{{{json.dumps(name)}: {given}}}"
    fixes.append(f"give its arguments by hand: check_agent(module, arguments={template})")
    if counts.failed:
        fixes.append(
            "answer its requests as its API would: respond=, or the module's DEV_STUBS "
            "(or point its toolset's setting at a server that accepts the call)"
        )
    fixes.append(
        "if it cannot complete in the check by design, say so: "
        f"check_agent(module, expect_incomplete={{{name!r}}})"
    )
    return fixes


def _formats(schema: Any) -> set[str]:
    """The string formats anywhere in a JSON schema."""
    found: set[str] = set()
    if isinstance(schema, Mapping):
        if isinstance(schema.get("format"), str):
            found.add(schema["format"])
        for value in schema.values():
            found |= _formats(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= _formats(value)
    return found
