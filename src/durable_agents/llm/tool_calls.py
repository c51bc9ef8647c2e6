"""Tool-call helpers shared by the adapters, and the call whose arguments did not parse.

OpenAI-format providers send a call's arguments as a JSON *string* written by
the model, and models sometimes write broken JSON. That must not crash the
run, and it must not run a side-effecting tool with guessed arguments. So the
adapter returns a `MalformedToolCall` (defined with the other message types):
a `ToolCall` with `arguments == {}` that also carries `raw_arguments` and
`arguments_error`. The run loop answers it with an error result built from
`arguments_error` and never calls the handler. Arguments nested deeper than
`_json.MAX_DEPTH` (128) levels are refused the same way, before parsing.

The guide: docs/llm-providers.md ("Arguments the model got wrong").
"""

from __future__ import annotations

import json
from typing import Any

from .. import _json
from ..messages import MalformedToolCall, ToolCall, token_count, tool_error

__all__ = ["decode_arguments", "is_error_result", "make_tool_call", "token_count"]


def decode_arguments(name: str, raw: Any) -> tuple[dict[str, Any], str | None]:
    """A call's arguments as a dict, and an error sentence when they were not an object.

    Accepts what OpenAI-compatible servers send: a JSON string (the standard),
    an already-decoded object (Workers AI, some local servers), or nothing.
    """
    if raw is None:
        return {}, None
    if isinstance(raw, dict):
        try:
            _json.check_depth(raw)
        except ValueError as exc:
            return {}, _too_deep(name, exc)
        return raw, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        try:
            value = _json.loads(raw)
        except _json.JSONTooDeepError as exc:
            return {}, _too_deep(name, exc)
        except ValueError as exc:
            return {}, (
                f"The arguments for tool {name!r} were not valid JSON ({exc}), so the tool was "
                "not run. Call it again with the arguments as one JSON object."
            )
        if value is None:
            return {}, None
        if isinstance(value, dict):
            return value, None
        raw_type = type(value).__name__
    else:
        raw_type = type(raw).__name__
    return {}, (
        f"The arguments for tool {name!r} were a JSON {raw_type}, not an object, so the tool "
        "was not run. Call it again with the arguments as one JSON object."
    )


def _too_deep(name: str, exc: ValueError) -> str:
    return (
        f"The arguments for tool {name!r} were refused ({exc}), so the tool was not run. "
        "Call it again with flatter arguments."
    )


def make_tool_call(call_id: str, name: str, raw_arguments: Any) -> ToolCall:
    """A `ToolCall`, or a `MalformedToolCall` when `raw_arguments` is not an object."""
    arguments, error = decode_arguments(name, raw_arguments)
    if error is None:
        return ToolCall(call_id, name, arguments)
    if isinstance(raw_arguments, str):
        raw = raw_arguments
    else:
        try:
            _json.check_depth(raw_arguments)
            raw = json.dumps(raw_arguments, default=str)
        except ValueError:  # too deep to encode (or a cycle): keep no copy
            raw = ""
    return MalformedToolCall(call_id, name, {}, raw_arguments=raw, arguments_error=error)


def is_error_result(content: str) -> bool:
    """True when a tool message's content is the `{"error": ...}` JSON of a failed call."""
    return tool_error(content) is not None
