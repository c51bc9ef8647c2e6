"""The agent's toolsets, listed once before the check (through the recording client, so
each server is reached as in the runs): their tools by name, or a `ConfigurationError`
saying which server to start. docs/testing.md covers toolsets in `check_agent`."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import ConfigurationError
from ...tools import RunContext, Tool, Toolset
from ._breach import toolset_name
from ._config import CheckEnv
from ._scenario import Scenario, Stage
from ._transport import CheckTransport


async def toolset_tools(
    agent_name: str,
    toolsets: Sequence[Toolset],
    own_tools: Mapping[str, Tool],
    *,
    stage: Stage,
    transport: CheckTransport,
    make_deps: Callable[..., Any],
    env: CheckEnv,
    settings: Mapping[str, str],
) -> dict[str, Tool]:
    """The tools `toolsets` list, by name; none may share a name with another tool."""
    listed: dict[str, Tool] = {}
    stage.scenario = Scenario("check-listing", "listing the toolsets", None)
    async with transport.client() as http:
        try:
            deps = make_deps(env, http)
        except Exception:
            deps = None  # (the first run says why)
        ctx: RunContext[Any] = RunContext(
            "check-listing",
            None,
            datetime.datetime.now(datetime.UTC),
            deps,
            settings=settings,
            http=http,
        )
        for toolset in toolsets:
            try:
                tools = await toolset.list_tools(ctx)
            except Exception as exc:
                raise ConfigurationError(_unlisted(agent_name, toolset, settings, exc)) from exc
            for t in tools:
                if t.name in own_tools or t.name in listed:
                    raise ConfigurationError(
                        f"agent {agent_name!r}: its toolset {toolset!r} lists a "
                        f"tool named {t.name!r}, which it has already"
                    )
                listed[t.name] = t
    stage.scenario = None
    return listed


def _unlisted(
    agent_name: str, toolset: Toolset, settings: Mapping[str, str], exc: Exception
) -> str:
    names = tuple(getattr(toolset, "settings", ()))
    values = ", ".join(f"{n}={settings[n]!r}" if n in settings else f"{n} not set" for n in names)
    return (
        f"check_agent: the toolset {toolset_name(toolset)} of agent {agent_name!r} could not "
        f"list its tools ({type(exc).__name__}: {exc}). check_agent sends a toolset's requests "
        f"to the real server its settings name ({values or 'none'}): start that server "
        "(your test may start one) and point the setting at it, e.g. "
        f"check_agent(..., env={{{(names or ('MCP_URL',))[0]!r}: "
        "'http://127.0.0.1:8000/mcp'})"
    )
