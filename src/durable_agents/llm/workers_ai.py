"""Workers AI through the Worker's `AI` binding: `await env.AI.run(model, inputs)`.

Use `WorkersAILLM` inside a Cloudflare Worker that has an `[ai]` binding: no
API key, no HTTP. Outside a Worker (or to reach Workers AI over REST), use
`OpenAILLM` with the account's OpenAI-compatible endpoint instead. The three
answer shapes the models use and the error codes that are retried:
docs/llm-providers.md#what-the-adapters-do-with-the-conversation.

`stream()` passes `stream: true`: the binding then answers with a
ReadableStream of server-sent events, `data: {"response": "<text piece>"}`
(tool calls and usage in the events that carry them; OpenAI-style
`chat.completion.chunk`s from the models that speak that) up to
`data: [DONE]`, read piece by piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from .._http.sse import sse_events, sse_lines
from ..errors import ConfigurationError
from ..messages import (
    LLMResponse,
    Message,
    StreamPart,
    TextDelta,
    ToolSpec,
    provider_call_ids,
)
from ._defaults import DEFAULT_WORKERS_AI_MODEL
from ._retry import RetryPolicy, attempt_timeout, call_with_retries, stream_with_retries
from .base import wire_size
from .errors import (
    LLMAuthenticationError,
    LLMConnectionError,
    LLMContextLengthError,
    LLMError,
    LLMHTTPError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMResponseError,
    LLMTimeoutError,
)
from .openai import (
    ChunkReader,
    message_wire_size,
    parse_tool_calls,
    parse_usage,
    read_chunks,
    to_openai_messages,
    to_openai_tool,
)
from .openai import parse_response as parse_openai_response

# Workers AI internal error code → (HTTP status it stands for, error class, what to do).
# Codes and statuses from the Workers AI error reference.
_ERRORS: dict[int, tuple[int, type[LLMHTTPError], str | None]] = {
    5007: (400, LLMModelNotFoundError, "no such Workers AI model; check LLM_MODEL."),
    3042: (404, LLMModelNotFoundError, "the model name is invalid; check LLM_MODEL."),
    5018: (403, LLMAuthenticationError, "this account may not use this model."),
    3041: (403, LLMAuthenticationError, "this account may not use this model."),
    5016: (403, LLMAuthenticationError, "accept the model's terms for this account first."),
    3023: (403, LLMAuthenticationError, "Workers AI is unavailable for this account."),
    3006: (413, LLMContextLengthError, None),
    3036: (429, LLMRateLimitError, "the account's daily Workers AI allocation is used up."),
    3040: (429, LLMRateLimitError, "Workers AI is out of capacity; try again shortly."),
    3007: (408, LLMHTTPError, "Workers AI timed out; try again."),
    3008: (408, LLMHTTPError, "Workers AI aborted the request; try again."),
}
# Retrying these cannot help within one run.
_NOT_RETRYABLE = {3036}
_TRANSIENT_WORDS = ("capacity", "timeout", "timed out", "internal", "upstream", "unavailable")
_CODE = re.compile(r"\b([35]\d{3})\b")


class WorkersAILLM:
    """A Workers AI text model with function calling, called through the `AI` binding.

    `binding` is `env.AI` as the Worker hands it to Python: an object whose
    `run(model, inputs)` is awaitable. `convert_input`, if given, turns the
    inputs dict into what `run` accepts (e.g. a JS object); results are
    converted back with their `to_py()` when they have one. `max_tokens` is
    sent when given (Workers AI's default is small for some models).
    `timeout` (seconds, per attempt) and `retry` work as in the HTTP adapters.
    """

    provider = "workers-ai"

    def __init__(
        self,
        binding: Any,
        model: str = DEFAULT_WORKERS_AI_MODEL,
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        extra_inputs: Mapping[str, Any] | None = None,
        convert_input: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if binding is None or not callable(getattr(binding, "run", None)):
            raise ConfigurationError(
                'WorkersAILLM needs the Workers AI binding (env.AI): add `[ai] binding = "AI"` '
                "to wrangler.toml and pass env.AI"
            )
        if not model:
            raise ConfigurationError("WorkersAILLM needs a model name (LLM_MODEL)")
        self.binding = binding
        self.model = model
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.extra_inputs = dict(extra_inputs or {})
        self.convert_input = convert_input

    def __repr__(self) -> str:
        return f"WorkersAILLM(model={self.model!r})"

    def request_inputs(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        """The inputs dict `chat()` passes to `binding.run(model, inputs)`."""
        inputs: dict[str, Any] = {"messages": _messages(messages)}
        if tools:
            inputs["tools"] = [to_openai_tool(spec) for spec in tools]
        if self.max_tokens is not None:
            inputs["max_tokens"] = self.max_tokens
        inputs.update(self.extra_inputs)
        return inputs

    def request_size(self, tools: Sequence[ToolSpec]) -> int:
        """The bytes of the inputs without messages, as JSON (`SizedLLM`): `stream()`'s."""
        return wire_size({**self.request_inputs([], tools), "stream": True})

    def message_size(self, message: Message) -> int:
        """The bytes `message` adds to the inputs, as JSON, with its comma (`SizedLLM`)."""
        return message_wire_size(_messages([message]))

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        inputs = self.request_inputs(messages, tools)
        argument = self.convert_input(inputs) if self.convert_input else inputs

        async def attempt(time_left: float) -> Any:
            return await self._run(argument, attempt_timeout(self.timeout, time_left))

        result = await call_with_retries(self.retry, attempt)
        return parse_result(result)

    async def _run(self, argument: Any, limit: float) -> Any:
        """One `binding.run()` within `limit` seconds; its errors as `LLMError`s."""
        try:
            async with asyncio.timeout(limit):
                return await self.binding.run(self.model, argument)
        except TimeoutError as exc:
            raise LLMTimeoutError(
                f"Workers AI did not answer within {limit:.3g} s (model {self.model})",
                provider=self.provider,
            ) from exc
        except Exception as exc:  # the binding raises JS errors as plain exceptions
            raise binding_error(exc) from exc

    def stream(self, messages: list[Message], tools: list[ToolSpec]) -> AsyncIterator[StreamPart]:
        """The reply as the model writes it: `TextDelta`s and `ToolCallDelta`s, then the
        `LLMResponse` `chat()` would return (see `StreamingLLM`). A binding that
        answers with a whole result instead of a stream gives its text as one delta."""
        inputs = {**self.request_inputs(messages, tools), "stream": True}
        argument = self.convert_input(inputs) if self.convert_input else inputs

        async def attempt(time_left: float) -> AsyncGenerator[StreamPart, None]:
            limit = attempt_timeout(self.timeout, time_left)
            result = await self._run(argument, limit)
            if not _is_stream(result):
                reply = parse_result(result)
                if reply.text:
                    yield TextDelta(reply.text)
                yield reply
                return
            chunks = _stream_chunks(result, limit, self.model)
            async with contextlib.aclosing(chunks):  # cancels the reader if left early
                events = sse_events(sse_lines(chunks))
                async with contextlib.aclosing(read_chunks(events, _WorkersAIChunks())) as parts:
                    async for part in parts:
                        yield part

        return stream_with_retries(self.retry, attempt, provider=self.provider)


class _WorkersAIChunks(ChunkReader):
    """Reads Workers AI's stream events: `{"response": "<piece>"}` with `tool_calls` and
    `usage` where they come, or OpenAI-style chunks (`choices`)."""

    def __init__(self) -> None:
        super().__init__("workers-ai")

    def add(self, chunk: Any) -> list[StreamPart]:
        if not isinstance(chunk, dict) or "choices" in chunk or chunk.get("error"):
            return super().add(chunk)
        if chunk.get("usage") is not None:
            super().add({"usage": chunk["usage"]})
        response = chunk.get("response")
        if response is not None and not isinstance(response, str):
            response = json.dumps(response, ensure_ascii=False)  # JSON mode
        return self.add_text(response) + self.add_tool_calls(chunk.get("tool_calls"))


def _is_stream(result: Any) -> bool:
    return hasattr(result, "__aiter__") or callable(getattr(result, "getReader", None))


async def _stream_chunks(stream: Any, limit: float, model: str) -> AsyncGenerator[bytes, None]:
    """The bytes of what `run(..., stream=True)` returned: a JS ReadableStream (read
    with its reader, each read bounded by `limit`) or a Python async iterable."""
    reader: Any = None
    if callable(getattr(stream, "getReader", None)):
        reader = stream.getReader()
        read: Callable[[], Any] = reader.read
    else:
        read = stream.__aiter__().__anext__
    done = False
    try:
        while True:
            try:
                async with asyncio.timeout(limit):
                    step = await read()
            except StopAsyncIteration:
                done = True
                return
            except TimeoutError as exc:
                raise LLMTimeoutError(
                    f"the Workers AI stream stalled for {limit:.3g} s (model {model})",
                    provider="workers-ai",
                ) from exc
            except Exception as exc:  # the stream errored (a JS error)
                error = binding_error(exc)
                if isinstance(error, LLMHTTPError):
                    raise error from exc
                raise LLMConnectionError(
                    f"the Workers AI stream broke off: {exc}", provider="workers-ai"
                ) from exc
            if reader is None:
                value = step
            else:
                if _field(step, "done"):
                    done = True
                    return
                value = _field(step, "value")
            if value is not None:
                yield _as_bytes(value)
    finally:
        if reader is not None and not done:
            with contextlib.suppress(Exception):
                await reader.cancel()


def _field(step: Any, name: str) -> Any:
    """A field of a reader's `{done, value}` (a dict once converted, else a JS proxy)."""
    to_py = getattr(step, "to_py", None)
    if callable(to_py) and not isinstance(step, Mapping):
        step = to_py()
    if isinstance(step, Mapping):
        return step.get(name)
    return getattr(step, name, None)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    to_bytes = getattr(value, "to_bytes", None)  # a JS Uint8Array's proxy
    if callable(to_bytes):
        return bytes(to_bytes())
    to_py = getattr(value, "to_py", None)
    if callable(to_py):
        return _as_bytes(to_py())
    return bytes(value)


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out = to_openai_messages(messages, empty_content="")
    wire_ids = provider_call_ids(messages)
    names = {
        wire_ids.get(m.tool_call_id, m.tool_call_id): m.tool_name
        for m in messages
        if m.role == "tool" and m.tool_call_id is not None
    }
    for entry in out:
        # Some Workers AI chat templates identify a tool result by the tool's name.
        if entry["role"] == "tool" and names.get(entry["tool_call_id"]):
            entry["name"] = names[entry["tool_call_id"]]
    return out


def binding_error(exc: BaseException) -> LLMError:
    """The `LLMError` for an exception raised by `env.AI.run`."""
    text = str(exc) or type(exc).__name__
    match = _CODE.search(text)
    code = int(match.group(1)) if match else None
    if code is not None and code in _ERRORS:
        status, cls, detail = _ERRORS[code]
        error: LLMError = cls(status, text, provider="workers-ai", detail=detail)
        if code in _NOT_RETRYABLE:
            error.retryable = False
        return error
    transient = any(word in text.lower() for word in _TRANSIENT_WORDS)
    return LLMError(
        f"the Workers AI binding failed: {text}"
        + ("" if transient else "; check LLM_MODEL and that the model supports function calling"),
        provider="workers-ai",
        retryable=transient,
    )


def parse_result(result: Any) -> LLMResponse:
    """The neutral reply for whatever shape `env.AI.run` returned."""
    to_py = getattr(result, "to_py", None)
    if callable(to_py):
        result = to_py()
    if isinstance(result, str):
        return LLMResponse(text=result)
    if not isinstance(result, Mapping):
        raise LLMResponseError(
            f"Workers AI returned a {type(result).__name__}, not a result object; is the "
            "model a text-generation model (and is `stream` off)?",
            provider="workers-ai",
            body=repr(result),
        )
    data = dict(result)
    if "choices" in data:
        return parse_openai_response(data)
    if "response" not in data and "tool_calls" not in data:
        raise LLMResponseError(
            "Workers AI returned neither `response` nor `tool_calls` nor `choices`; is the "
            "model a text-generation model?",
            provider="workers-ai",
            body=repr(data),
        )
    response = data.get("response")
    if response is None:
        text = ""
    elif isinstance(response, str):
        text = response
    else:  # JSON mode answers with the object itself
        text = json.dumps(response, ensure_ascii=False)
    return LLMResponse(
        text=text,
        tool_calls=parse_tool_calls(data.get("tool_calls")),
        usage=parse_usage(data.get("usage")),
    )
