"""What a turn starts with: the arguments `run()` checks first, the agent's tools bound
to their handlers, its toolsets' tools listed, and the turn's instructions (a string,
or made by the agent's function for a new turn and stored with its message).

Guides: docs/turns.md (Instructions made per turn), docs/mcp.md (toolsets).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _json
from ..agent import Agent
from ..errors import (
    ConfigurationError,
    DurableAgentsError,
    MessageTooLargeError,
    ToolsetError,
    describe_exception,
)
from ..messages import ORIGINS, OUTPUT_TOOL, Message, MessageOrigin
from ..tools import Handler, RunContext, Tool, Toolset

if TYPE_CHECKING:
    import httpx

__all__ = [
    "RunClient",
    "Setup",
    "ToolsetSettingsError",
    "add_toolset_tools",
    "bind_tools",
    "checked_message",
    "instructions_for_turn",
    "turn_instructions",
]


RUN_CLIENT_TIMEOUT = 30.0
"""The default timeout (seconds) of the client a run makes for its toolsets; `MCPTools`
sets its own on each request."""


class RunClient:
    """The turn's `RunContext.http`: `run(http=)`'s client, else, for an agent with
    toolsets, one the run makes (`default_client`) on first use and closes when it ends
    (`aclose`). So a toolset kept at module level (an `MCPTools` in the agent module)
    never holds a client from one event loop into the next."""

    def __init__(self, given: httpx.AsyncClient | None) -> None:
        self.given = given
        self._own: httpx.AsyncClient | None = None

    def for_toolsets(self) -> httpx.AsyncClient:
        """The client toolsets list and call through: the given one, else the run's own."""
        if self.given is not None:
            return self.given
        if self._own is None:
            from .._http.client import default_client  # httpx loads for a toolset only

            self._own = default_client(RUN_CLIENT_TIMEOUT)
        return self._own

    async def aclose(self) -> None:
        """Close the client the run made, if it made one (a given client is left open)."""
        own, self._own = self._own, None
        if own is not None:
            await own.aclose()


@dataclass(frozen=True, slots=True)
class Setup:
    """What `run()` was given for the turn's `RunContext` besides the session."""

    settings: Mapping[str, str]
    client: RunClient


def checked_message(
    agent: Agent[Any],
    session_id: str | None,
    message: str | None,
    request_key: str | None,
    origin: MessageOrigin | None,
) -> str | None:
    """`run()`'s message, checked with its companions and ready to store (ConfigurationError
    or MessageTooLargeError if it cannot be)."""
    if origin is not None and origin not in ORIGINS:
        raise ConfigurationError(f"origin must be one of {ORIGINS} or None, got {origin!r}")
    if message is not None:
        _check_user_message(agent, session_id, message)
        message = _json.repair_text(message)  # stored as UTF-8: no lone surrogates
    if request_key is not None and message is None:
        raise ConfigurationError("request_key identifies a message; pass it with message=")
    return message


def _check_user_message(agent: Agent[Any], session_id: str | None, message: object) -> None:
    if not isinstance(message, str):
        raise ConfigurationError(f"message must be a string, got {type(message).__name__}")
    size = len(message.encode("utf-8", "surrogatepass"))
    if size > agent.max_message_bytes:
        raise MessageTooLargeError(
            session_id or "(new session)",
            size,
            agent.max_message_bytes,
            "user",
            limit_name=f"max_message_bytes of agent {agent.name!r}",
        )


def bind_tools(agent: Agent[Any], handlers: Mapping[str, Handler]) -> dict[str, Tool]:
    """The agent's tools by name, each with its handler (from `handlers` or its own)."""
    declared = {t.name: t for t in agent.tools}
    unknown = sorted(set(handlers) - set(declared))
    if unknown:
        raise ConfigurationError(
            f"handlers given for tools that agent {agent.name!r} does not declare: {unknown}; "
            f"declared: {sorted(declared)}"
        )
    bound = {
        name: t.with_handler(handlers[name]) if name in handlers else t
        for name, t in declared.items()
    }
    missing = sorted(name for name, t in bound.items() if t.handler is None)
    if missing:
        raise ConfigurationError(
            f"tools {missing} of agent {agent.name!r} have no handler; pass them as "
            "run(..., tools={name: handler})"
        )
    return bound


async def add_toolset_tools(
    agent: Agent[Any], ctx: RunContext[Any], tools: dict[str, Tool], *, has_output: bool
) -> None:
    """Add the tools the agent's toolsets list this turn to `tools` (ToolsetError if one
    cannot list them, or lists a name the turn has already)."""
    for toolset in agent.toolsets:
        for listed in await _listed(toolset, ctx):
            if listed.name in tools or (has_output and listed.name == OUTPUT_TOOL):
                # What a remote server lists is no programming mistake: the turn ends
                # as a toolset-error (its message kept), and a resume tries again.
                raise ToolsetError(
                    listed.source or type(toolset).__name__,
                    f"it lists a tool named {listed.name!r}, which agent {agent.name!r} "
                    "has already; give the toolset a prefix= or leave the tool out "
                    "(allow=)",
                )
            tools[listed.name] = listed


class ToolsetSettingsError(ToolsetError):
    """A toolset could not list its tools for want of a setting (missing, empty or
    wrong): `run()` ends the turn as for a `ToolsetError`, with `error_code`
    "configuration", since trying again changes nothing until the setting is set."""

    code = "configuration"


async def _listed(toolset: Toolset, ctx: RunContext[Any]) -> Sequence[Tool]:
    """The toolset's tools this turn. Any failure to list them (its server down, a
    setting missing, a bug in its code) is a `ToolsetError`: the turn ends resumable
    with its message kept, never a crash that loses the message."""
    try:
        return await toolset.list_tools(ctx)
    except ToolsetError:
        raise
    except ConfigurationError as exc:  # a setting to set: say which, and where
        raise ToolsetSettingsError(_label(toolset), _settings_problem(toolset, ctx, exc)) from exc
    except Exception as exc:
        name = type(toolset).__name__
        problem = describe_exception(exc)
        if isinstance(exc, DurableAgentsError):  # the kit's own words
            problem = str(exc).removeprefix(f"{name}: ")
        raise ToolsetError(name, f"its tools could not be listed: {problem}") from exc


def _label(toolset: Toolset) -> str:
    """A toolset in a message: its repr (`MCPTools(url_setting='MCP_URL', name=None)`), or
    its class's name when it has no repr of its own."""
    if type(toolset).__repr__ is object.__repr__:
        return type(toolset).__name__
    return repr(toolset)


def _settings_problem(toolset: Toolset, ctx: RunContext[Any], exc: ConfigurationError) -> str:
    """Why the toolset could not list its tools, the settings to fix, and where they are set."""
    problem = str(exc).removeprefix(f"{type(toolset).__name__}: ").rstrip(".")
    names = [n for n in getattr(toolset, "settings", ()) if isinstance(n, str)]
    unset = [n for n in names if not str(ctx.settings.get(n) or "").strip()]
    fix = unset or names
    if not fix:
        return f"its tools could not be listed: {problem}"
    which = f"{'Set' if unset else 'Fix'} {' and '.join(fix)}"
    return (
        f"its tools could not be listed: {problem}. {which} where the agent's settings "
        f"come from: on Cloudflare, [vars] in wrangler.toml or a secret (`scripts/wrangler "
        f"secret put {fix[0]}`); with scripts/dev, .dev.vars or the environment (or a dev "
        "stub in the agent module's DEV_STUBS); with run(), its settings= (default "
        "os.environ)"
    )


def turn_instructions(history: Sequence[Message]) -> str | None:
    """The instructions stored with the turn in progress (or last): on its first message,
    or on a summary that folded it."""
    for message in reversed(history):
        if message.role == "user" or message.is_summary:
            return message.instructions
    return None


async def instructions_for_turn(
    agent: Agent[Any, Any], ctx: RunContext[Any], history: Sequence[Message], message: str | None
) -> tuple[str, str | None]:
    """An instructions function's text for the turn: (the system message's text, what
    to store with the turn's message). Made for a new turn (`message`), read back
    from the turn's first write when it is resumed."""
    stored = None if message is not None else turn_instructions(history)
    text = stored if stored is not None else await _make_instructions(agent, ctx)
    return text, text if message is not None else None


async def _make_instructions(agent: Agent[Any, Any], ctx: RunContext[Any]) -> str:
    """The agent's instructions function, called for a new turn."""
    assert not isinstance(agent.instructions, str)
    try:
        value: Any = agent.instructions(ctx)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        raise ConfigurationError(
            f"the instructions function of agent {agent.name!r} raised {describe_exception(exc)}"
        ) from exc
    if not isinstance(value, str):
        raise ConfigurationError(
            f"the instructions function of agent {agent.name!r} must return a str, "
            f"got {type(value).__name__}"
        )
    return _json.repair_text(value)
