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

The guide: docs/testing.md#offline-models-and-crash-points. The arguments
`TestLLM` makes come from the kit's JSON Schema generator (`durable_agents._schema`);
`values=` steers them per format: docs/testing.md#steering-testllms-values.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import inspect
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..messages import (
    OUTPUT_TOOL,
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
    in `call_tools`), all at once, with arguments made from each input
    schema (`arguments_for`): a `default` or the first `enum` value or
    `const` that fits, the smallest number the bounds allow, a string that
    fits its `minLength`/`maxLength`, its `format` (a valid date, uuid,
    email, url...) and its `pattern` (an example string of the regex), the
    items `minItems` asks for (all different under `uniqueItems`), every
    property of an object. `arguments={tool name: arguments}` gives a tool's
    arguments by hand instead. `values={format or type: value}` steers the
    values it makes for a JSON-schema format (a Python type stands for the
    format pydantic writes for it): `{"date-time": "future"}` (or `datetime:
    "future"`) makes every date-time a week after the run's now (`"past"` a
    week before; the same for `"date"`/`date`), `{"email": "ann@example.org"}`
    a constant, `{datetime: lambda now: now + timedelta(days=3)}` a value of
    now; each must still fit its schema, else `ConfigurationError` names the
    field. `now` is read from `clock` (seconds, as `run(clock=)` takes it:
    give it the run's clock; default `time.time`) when it makes arguments.
    With `one_per_step=True` it calls them one
    step after another instead. Then it answers `text`, or a JSON summary of
    the results by tool name. Tool failures are results like any other: it
    does not retry them. An agent with `output_type` is answered through its
    `final_result` tool instead of text: called on its own, last, with
    arguments made from the output type's schema.

    A schema it cannot fill (a pattern with a lookahead, say) makes `chat()`
    raise `ConfigurationError` naming the tool and each field by its JSON
    path, so `run()` ends with status "error" saying so: give the field a
    default, or pass `arguments=`.

    Use it to run any agent offline (`LLM_PROVIDER=demo` does) and to check
    an agent's durability (`testing.check_agent`); `FunctionLLM` for a model
    written for one agent.
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
        arguments: Mapping[str, Mapping[str, Any]] | None = None,
        values: Mapping[Any, Any] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        from .._schema.formats import steered_formats  # see `arguments_for`

        self.call_tools = list(call_tools) if call_tools is not None else None
        self.one_per_step = one_per_step
        self.text = text
        self.delta_delay = delta_delay
        self.arguments = {name: dict(value) for name, value in (arguments or {}).items()}
        self.steers = steered_formats(values)  # checked now: a bad key fails here
        self.clock = clock or time.time
        self.calls = 0

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        self.calls += 1
        turn = _current_turn(messages)
        called = {c.name for m in turn for c in m.tool_calls}
        answer = next((t for t in tools if t.name == OUTPUT_TOOL), None)
        wanted = [
            t
            for t in tools
            if t is not answer and (self.call_tools is None or t.name in self.call_tools)
        ]
        due = [t for t in wanted if t.name not in called]
        usage = Usage(max(1, sum(len(m.content) for m in messages) // 4), 8)
        if not due and answer is not None:  # the typed answer: on its own, last
            due = [answer]
        if due:
            batch = due[:1] if self.one_per_step else due
            calls = [
                ToolCall(f"test_{len(messages)}_{i}", t.name, self.arguments_of(t))
                for i, t in enumerate(batch)
            ]
            return LLMResponse("", calls, usage)
        return LLMResponse(self._reply(turn), [], usage)

    def arguments_of(self, spec: ToolSpec) -> dict[str, Any]:
        """The arguments it calls `spec`'s tool with: those given, else made from its schema."""
        given = self.arguments.get(spec.name)
        if given is not None:
            return copy.deepcopy(given)
        now = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)
        from .._schema.values import example_arguments  # see `arguments_for`

        return example_arguments(
            spec.input_schema, tool_name=spec.name, steers=self.steers, now=now
        )

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


def arguments_for(
    schema: Mapping[str, Any],
    *,
    tool_name: str | None = None,
    validate: Callable[[dict[str, Any]], object] | None = None,
    values: Mapping[Any, Any] | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """Arguments that satisfy a tool's input schema, as `TestLLM` makes them.

    Handles what pydantic writes for a model: `$ref`/`$defs`, `anyOf`/`oneOf`
    (`Optional`, unions), `allOf`, `const`/`enum` (`Literal`, `Enum`),
    `default`, number bounds and `multipleOf`, string lengths, `pattern`
    (an example string of the regex) and the common `format`s (date-time,
    date, time, duration, uuid, email, uri, hostname, ipv4, ipv6, ...),
    `minItems`/`maxItems`, `uniqueItems` and `prefixItems` (tuples),
    `additionalProperties`, `minProperties`. The result is checked against
    the schema and, given `validate` (say the tool's pydantic
    `model_validate`), against that; what cannot be filled raises
    `ConfigurationError` naming `tool_name` and each field by its JSON path.
    `values` steers formats as `TestLLM(values=)` does, at time `now` (an aware
    datetime; default: now).
    """
    # The test-value generator loads when arguments are first made: a Worker whose agent
    # plays a FunctionLLM (or a real model) never needs it.
    from .._schema.formats import steered_formats
    from .._schema.values import example_arguments

    if now is None and values:
        now = datetime.datetime.now(datetime.UTC)
    return example_arguments(
        schema, tool_name=tool_name, validate=validate, steers=steered_formats(values), now=now
    )
