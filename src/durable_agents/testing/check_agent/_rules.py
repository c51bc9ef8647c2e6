"""The rules the check judges a stored call by: whether it is safe to retry and whether it
needs approval (the kit's policy stored with a toolset's call, else the agent's own tool),
and what checks its arguments, as `approve()` checks an edit."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel

from ...approvals import approval_digest
from ...messages import Message, ToolCall
from ...tools import Tool


class CallRules(NamedTuple):
    """How the kit treats a call: run again after a crash, or wait for a person first."""

    safe_to_retry: bool
    requires_approval: bool


class ToolRules:
    """The agent's own tools and its toolsets' (as listed before the check), by name."""

    def __init__(self, tools: Mapping[str, Tool], listed: Mapping[str, Tool]) -> None:
        self.tools = tools
        self.listed = listed

    def of(self, call: ToolCall) -> CallRules | None:
        """The rules as the kit decides a stored call: by the policy stored with a toolset's
        call, else by the agent's own tool; None for no such tool."""
        if call.policy is not None:
            policy = call.policy
            return CallRules(
                policy.get("safe_to_retry") is True, policy.get("requires_approval") is True
            )
        tool = self.tools.get(call.name)
        return None if tool is None else CallRules(tool.safe_to_retry, tool.requires_approval)

    def of_tool(self, name: str) -> CallRules | None:
        """The rules of a tool by name (for a handler run of no stored call)."""
        ran = self.tools.get(name) or self.listed.get(name)
        return None if ran is None else CallRules(ran.safe_to_retry, ran.requires_approval)

    def safe_by_name(self, history: Sequence[Message]) -> dict[str, bool]:
        """Each tool's safe_to_retry, by name: the agent's declaration, or for a toolset's
        tool what the kit stored with its calls (the listing's, before any call)."""
        safe = {name: t.safe_to_retry for name, t in self.listed.items()}
        for message in history:
            for call in message.tool_calls:
                rules = self.of(call)
                if call.policy is not None and rules is not None:
                    safe[call.name] = rules.safe_to_retry
        safe.update({name: t.safe_to_retry for name, t in self.tools.items()})
        return safe

    def checking(self, call: ToolCall) -> Tool:
        """What checks arguments for `call`, as `approve()` checks an edit: the input schema
        stored with a toolset's call, else the agent's own tool."""
        if call.policy is not None:
            schema = call.policy.get("input_schema")
            return Tool(call.name, "", schema if isinstance(schema, dict) else {"type": "object"})
        return self.tools[call.name]


def plain(args: Any) -> Any:
    """A handler's `args` as JSON values, to compare with arguments as stored."""
    if isinstance(args, BaseModel):
        return args.model_dump(mode="json")
    return copy.deepcopy(args)


def is_models_own(session_id: str, call: ToolCall, arguments: Mapping[str, Any]) -> bool:
    """Whether `arguments` are the model's own (the same digest: `approve()` then stores a
    plain approval)."""
    try:
        edited = approval_digest(session_id, call.id, call.name, arguments)
    except (TypeError, ValueError):
        return False
    return edited == approval_digest(session_id, call.id, call.name, call.arguments)
