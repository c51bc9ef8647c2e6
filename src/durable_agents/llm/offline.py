"""Models that run offline, for any agent: `TestLLM` and `FunctionLLM`.

    TestLLM()          calls every tool once, with arguments made from its
                       input schema, then answers with text. Knows nothing of
                       the agent: what `LLM_PROVIDER=demo` runs, and what
                       `testing.check_agent` drives an agent with.
    FunctionLLM(fn)    answers with `fn(messages, tools)`, sync or async: a
                       model written for one agent's demo or test, in a few lines.

Both read only the conversation they are sent, like a real model: resumed
after a crash, they continue from what is stored. Neither touches the network.
Both stream too (`stream()`, see `StreamingLLM`): the reply's text in
word-sized `TextDelta`s, `delta_delay` seconds apart (0 by default), so a
served offline agent streams visibly.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..messages import (
    LLMResponse,
    Message,
    StreamPart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

ModelFunction = Callable[[list[Message], list[ToolSpec]], LLMResponse | Awaitable[LLMResponse]]


class FunctionLLM:
    """An LLM whose every answer is `fn(messages, tools)` (sync or async).

    `messages` is the whole conversation, system message first; `tools` the
    agent's tool specs. Use it for a scripted demo model of your own agent,
    or in tests where the answer depends on what the model was sent (see
    `testing.ScriptedLLM` for a fixed list of answers).
    """

    model = "function"

    def __init__(self, fn: ModelFunction, *, delta_delay: float = 0.0) -> None:
        self.fn = fn
        self.delta_delay = delta_delay
        self.calls = 0

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        self.calls += 1
        answer = self.fn(list(messages), list(tools))
        response = await answer if inspect.isawaitable(answer) else answer
        if not isinstance(response, LLMResponse):
            raise TypeError(f"FunctionLLM's function returned {type(response).__name__}")
        return response

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[StreamPart]:
        """`chat()`'s answer in pieces: its text word by word, its calls, then the answer."""
        async for part in stream_response(await self.chat(messages, tools), self.delta_delay):
            yield part


def text_pieces(text: str) -> list[str]:
    """`text` cut into word-sized pieces (each word with the spaces after it)."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


async def stream_response(response: LLMResponse, delay: float = 0.0) -> AsyncIterator[StreamPart]:
    """Stream a known answer as a model would: word-sized `TextDelta`s (`delay` seconds
    before each), one `ToolCallDelta` per call, then `response` itself."""
    for piece in text_pieces(response.text):
        if delay > 0:
            await asyncio.sleep(delay)
        yield TextDelta(piece)
    for index, call in enumerate(response.tool_calls):
        yield ToolCallDelta(index, call.id, call.name, json.dumps(call.arguments))
    yield response


class TestLLM:
    """Calls each tool once per turn, then replies with text (no network, no key).

    In a turn's first step it calls every tool the agent has (or those named
    in `call_tools`), all at once, with arguments generated from each input
    schema (`arguments_for`): the first `enum` value or `const`, a `default`,
    the smallest number the bounds allow, a string of `minLength` "a"s (or a
    valid date, uuid, email, url... for a `format`), `minItems` elements,
    every property of an object. With `one_per_step=True` it calls
    them one step after another instead. Then it answers `text`, or a JSON
    summary of the results by tool name. Tool failures are results like any
    other: it does not retry them.

    Use it to run any agent offline (`LLM_PROVIDER=demo` does) and to check
    an agent's durability (`testing.check_agent`). Arguments a schema's
    `pattern` constrains are not generated to match it: give such fields a
    `default`, or use `FunctionLLM`.
    """

    __test__ = False  # not a pytest test class, despite its name
    model = "test"

    def __init__(
        self,
        *,
        call_tools: Sequence[str] | None = None,
        one_per_step: bool = False,
        text: str | None = None,
        delta_delay: float = 0.0,
    ) -> None:
        self.call_tools = list(call_tools) if call_tools is not None else None
        self.one_per_step = one_per_step
        self.text = text
        self.delta_delay = delta_delay
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

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[StreamPart]:
        """`chat()`'s answer in pieces: its text word by word (`delta_delay` seconds
        apart), its calls, then the answer."""
        async for part in stream_response(await self.chat(messages, tools), self.delta_delay):
            yield part

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
    """Arguments that satisfy a tool's input schema, as `TestLLM` makes them.

    Handles what pydantic writes for a model: `$ref`/`$defs`, `anyOf`
    (`Optional`), `const`/`enum` (`Literal`, `Enum`), `default`, number
    bounds and `multipleOf`, string lengths and the common `format`s
    (date-time, date, time, duration, uuid, email, uri, ipv4, ipv6),
    `minItems`, `uniqueItems` and `prefixItems` (tuples). A `pattern` is
    not followed.
    """
    value = _example(schema, schema.get("$defs") or schema.get("definitions") or {}, depth=0)
    return value if isinstance(value, dict) else {}


# A valid value for each string format pydantic emits (datetime, UUID, HttpUrl, ...).
_FORMATS: Mapping[str, str] = {
    "date-time": "2000-01-01T00:00:00Z",
    "date": "2000-01-01",
    "time": "00:00:00",
    "duration": "PT0S",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "uri": "https://example.com/",
    "iri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
}


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
        return _array(schema, defs, depth)
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    if kind == "string":
        if schema.get("format") in _FORMATS:
            return _FORMATS[schema["format"]]
        length = max(1, int(schema.get("minLength", 1)))
        if "maxLength" in schema:
            length = min(length, int(schema["maxLength"]))
        return "a" * length
    if kind == "boolean":
        return False
    return None


def _array(schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> list[Any]:
    prefix = schema.get("prefixItems") or []
    item = schema.get("items")
    if not isinstance(item, Mapping):  # absent, or a draft-4 tuple list
        item = {}
    count = max(len(prefix), int(schema.get("minItems", 0)))
    values = [
        _example(prefix[i] if i < len(prefix) else item, defs, depth + 1) for i in range(count)
    ]
    if schema.get("uniqueItems"):
        enum = item.get("enum")
        for i in range(1, len(values)):
            if enum and i < len(enum):
                values[i] = enum[i]
            elif isinstance(values[i], bool):
                values[i] = i == 1
            elif isinstance(values[i], int | float):
                values[i] += i * item.get("multipleOf", 1)
            elif isinstance(values[i], str):
                values[i] = f"{values[i]}{i}"
    return values


def _number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    """The smallest value the bounds allow (or one inside them), else 1; a multiple
    of `multipleOf` when given."""
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum", min)
    value: float
    if integer:
        lo = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
        hi = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
        value = lo if lo is not None else (min(1, hi) if hi is not None else 1)
    elif low is None:
        value = 1.0 if high is None else min(1.0, high - 1 if high_open else high)
    elif high is None:
        value = low + 1 if low_open else low
    else:
        value = (low + high) / 2 if low_open else low
    step = schema.get("multipleOf")
    if step:
        value = math.ceil(value / step) * step
    return int(value) if integer else float(value)


def _bound(
    schema: Mapping[str, Any], closed: str, open_: str, tighter: Callable[[float, float], float]
) -> tuple[float | None, bool]:
    """One side's bound and whether it is exclusive (the tighter of the two keywords)."""
    inclusive, exclusive = schema.get(closed), schema.get(open_)
    if exclusive is None or isinstance(exclusive, bool):  # draft-4 booleans: ignore
        return inclusive, False
    if inclusive is None or tighter(inclusive, exclusive) == exclusive:
        return exclusive, True
    return inclusive, False
