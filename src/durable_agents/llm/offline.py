"""Models that run offline, for any agent: `TestLLM` and `FunctionLLM`.

    TestLLM()          calls every tool once, with arguments made from its
                       input schema, then answers with text. Knows nothing of
                       the agent: what `LLM_PROVIDER=demo` runs, and what
                       `testing.check_agent` drives an agent with.
    FunctionLLM(fn)    answers with `fn(messages, tools)`, sync or async: a
                       model written for one agent's demo or test, in a few lines.

Both read only the conversation they are sent, like a real model: resumed
after a crash, they continue from what is stored. Neither touches the network.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..messages import LLMResponse, Message, ToolCall, ToolSpec, Usage

ModelFunction = Callable[[list[Message], list[ToolSpec]], LLMResponse | Awaitable[LLMResponse]]


class FunctionLLM:
    """An LLM whose every answer is `fn(messages, tools)` (sync or async).

    `messages` is the whole conversation, system message first; `tools` the
    agent's tool specs. Use it for a scripted demo model of your own agent,
    or in tests where the answer depends on what the model was sent (see
    `testing.ScriptedLLM` for a fixed list of answers).
    """

    model = "function"

    def __init__(self, fn: ModelFunction) -> None:
        self.fn = fn
        self.calls = 0

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        self.calls += 1
        answer = self.fn(list(messages), list(tools))
        response = await answer if inspect.isawaitable(answer) else answer
        if not isinstance(response, LLMResponse):
            raise TypeError(f"FunctionLLM's function returned {type(response).__name__}")
        return response


class TestLLM:
    """Calls each tool once per turn, then replies with text (no network, no key).

    In a turn's first step it calls every tool the agent has (or those named
    in `call_tools`), all at once, with arguments generated from each input
    schema: the first `enum` value or `const`, a `default`, the smallest
    number the bounds allow, a string of `minLength` "a"s, `minItems`
    elements, every property of an object. With `one_per_step=True` it calls
    them one step after another instead. Then it answers `text`, or a JSON
    summary of the results by tool name. Tool failures are results like any
    other: it does not retry them.

    Use it to run any agent offline (`LLM_PROVIDER=demo` does) and to check
    an agent's durability (`testing.check_agent`). Arguments a schema's
    `pattern` or `format` constrains are not generated to match them: give
    such fields a `default`, or use `FunctionLLM`.
    """

    __test__ = False  # not a pytest test class, despite its name
    model = "test"

    def __init__(
        self,
        *,
        call_tools: Sequence[str] | None = None,
        one_per_step: bool = False,
        text: str | None = None,
    ) -> None:
        self.call_tools = list(call_tools) if call_tools is not None else None
        self.one_per_step = one_per_step
        self.text = text
        self.calls = 0

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        self.calls += 1
        turn = _current_turn(messages)
        called = {c.name for m in turn for c in m.tool_calls}
        wanted = [t for t in tools if self.call_tools is None or t.name in self.call_tools]
        due = [t for t in wanted if t.name not in called]
        usage = Usage(max(1, sum(len(m.content) for m in messages) // 4), 8)
        if due:
            batch = due[:1] if self.one_per_step else due
            calls = [
                ToolCall(f"test_{len(messages)}_{i}", t.name, arguments_for(t.input_schema))
                for i, t in enumerate(batch)
            ]
            return LLMResponse("", calls, usage)
        return LLMResponse(self._reply(turn), [], usage)

    def _reply(self, turn: Sequence[Message]) -> str:
        if self.text is not None:
            return self.text
        results = {m.tool_name or "": m.content for m in turn if m.role == "tool"}
        return json.dumps(results, ensure_ascii=False) if results else "success (no tool calls)"


def _current_turn(messages: Sequence[Message]) -> list[Message]:
    """The messages since the last user message (the turn being played)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return list(messages[index:])
    return list(messages)


def arguments_for(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy a tool's input schema, as `TestLLM` makes them."""
    value = _example(schema, schema.get("$defs") or schema.get("definitions") or {}, depth=0)
    return value if isinstance(value, dict) else {}


def _example(schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Any:
    if depth > 32:  # a recursive schema: stop somewhere
        return None
    if "$ref" in schema:
        target = defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
        return _example(target, defs, depth + 1)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _example(options[0], defs, depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties: Mapping[str, Any] = schema.get("properties") or {}
        return {name: _example(sub, defs, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        item = schema.get("items") or {}
        return [_example(item, defs, depth + 1) for _ in range(int(schema.get("minItems", 0)))]
    if kind in ("integer", "number"):
        return _smallest_number(schema, integer=kind == "integer")
    if kind == "string":
        return "a" * max(1, int(schema.get("minLength", 1)))
    if kind == "boolean":
        return False
    return None


def _smallest_number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    step = 1 if integer else 0.5
    if "minimum" in schema:
        value = schema["minimum"]
    elif "exclusiveMinimum" in schema:
        value = schema["exclusiveMinimum"] + step
    elif "maximum" in schema and schema["maximum"] < 1:
        value = schema["maximum"]
    elif "exclusiveMaximum" in schema and schema["exclusiveMaximum"] <= 1:
        value = schema["exclusiveMaximum"] - step
    else:
        value = 1
    return int(value) if integer else float(value)
