"""Agents as tools: an agent's tool that runs a turn of another agent, exactly once.

    refunds = Agent("refunds", "You handle refunds.", [refund], output_type=Refund)
    support = Agent("support", "You help customers.", [agent_tool("refunds",
                    description="Ask the refunds team to refund an order.")])

    await run(support, llm=llm, message="...", session_id="s1", store=store,
              agents={"refunds": refunds})

The model sends `{"message": "..."}`; the call's result is the child's answer. Why a
crash anywhere never runs the child's turn twice, and what the parent is told when
the child gives no answer: docs/python-api.md (Agents as tools). The machinery
(the runners, the depth, the usage) is `_turn.delegation`.
"""

from __future__ import annotations

from ._child_sessions import child_session_name
from ._turn.delegation import (
    DEFAULT_MAX_DEPTH,
    AgentRunner,
    AgentToolHandler,
    AgentTurn,
    AgentTurnOutcome,
    LocalAgent,
    at_depth,
)
from .errors import ConfigurationError
from .tools import Tool, tool

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "AgentRunner",
    "AgentToolHandler",
    "AgentTurn",
    "AgentTurnOutcome",
    "LocalAgent",
    "agent_tool",
    "at_depth",
    "child_session_name",
]

MESSAGE_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "What to ask the agent, in full."}},
    "required": ["message"],
    "additionalProperties": False,
}


def agent_tool(
    agent: str,
    *,
    description: str,
    name: str | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Tool:
    """A tool that runs one turn of the agent named `agent` (a name of `run(agents=)`)
    and answers with its final reply, or its typed output as JSON.

    Each call runs its turn in a session of its own (`child_session_name` of the
    parent's session and the call), started with the call's idempotency key as its
    request key: a call run again after a crash finishes or reads back that turn and
    never starts a second, so the tool is `safe_to_retry`. The child's events reach
    the parent's `on_event` as `ChildEvent`s, cancelling the parent cancels it, and
    the tokens it used are stored on the call's result, counted toward the parent
    session's `max_session_tokens`.

    `name` is the tool's name for the model (default: `agent`). `max_depth` bounds
    agents calling agents: a call that would run a turn deeper (the top-level turn is
    0) runs nothing and is answered `agent-depth-exceeded`. A child turn that gives
    no answer (error, budget exceeded, cancelled, ...) is answered `agent-failed`.
    """
    if type(max_depth) is not int or max_depth < 1:
        raise ConfigurationError(f"max_depth must be a positive int, got {max_depth!r}")
    return tool(
        name=name or agent,
        description=description,
        input=MESSAGE_SCHEMA,
        safe_to_retry=True,
        handler=AgentToolHandler(agent, max_depth),
    )
