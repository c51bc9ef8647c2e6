"""OpenAI Chat Completions (`POST {base_url}/chat/completions`) with function tools:
`OpenAILLM`.

Use it for OpenAI itself and any OpenAI-compatible server (Workers AI's REST
endpoint, Ollama, vLLM, llama.cpp's server); inside a Worker with an `AI`
binding, `WorkersAILLM` needs no key; for Claude, `AnthropicLLM`. The
differences between compatible servers it tolerates are listed in
docs/llm-providers.md#what-the-adapters-do-with-the-conversation; arguments
that are not a JSON object become a `MalformedToolCall` (`llm.tool_calls`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from .._http.sse import SSEEvent
from ..errors import ConfigurationError
from ..messages import (
    LLMResponse,
    Message,
    StreamPart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    provider_call_ids,
)
from ._defaults import OPENAI_BASE_URL
from ._http import HTTPAdapter, HTTPPoster, check_base_url
from ._retry import RetryPolicy
from ._stream import json_data, stream_cut, stream_error
from .base import wire_size
from .errors import LLMResponseError, provider_message
from .tool_calls import make_tool_call, token_count


class OpenAILLM(HTTPAdapter):
    """A model behind an OpenAI-compatible Chat Completions endpoint.

    `api_key` is sent as a Bearer token; leave it out for local servers that
    need none. `max_tokens` is sent only when given (newer OpenAI models want
    `extra_body={"max_completion_tokens": n}` instead). `client=`,
    `transport=`, `timeout=`, `retry=` and `extra_body=` work as in
    `AnthropicLLM`.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        *,
        base_url: str = OPENAI_BASE_URL,
        max_tokens: int | None = None,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ConfigurationError("OpenAILLM needs a model name (LLM_MODEL)")
        self.model = model
        self.base_url = check_base_url(base_url)
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self._api_key = api_key or None
        self._http = HTTPPoster(
            provider=self.provider,
            client=client,
            transport=transport,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            secret=self._api_key,
        )

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        """The JSON body `chat()` sends for this conversation."""
        body = build_request(self.model, messages, tools)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return await self._http.post_json(
            f"{self.base_url}/chat/completions",
            headers,
            self.request_body(messages, tools),
            parse_response,
        )

    def request_size(self, tools: Sequence[ToolSpec]) -> int:
        """The bytes of a request without messages (`SizedLLM`): `stream()`'s, the larger."""
        return wire_size(self.stream_body([], tools))

    def message_size(self, message: Message) -> int:
        """The bytes `message` adds to a request, with its comma (`SizedLLM`)."""
        return message_wire_size(to_openai_messages([message]))

    def stream_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The JSON body `stream()` sends: `chat()`'s with `"stream": true` and usage asked for."""
        body = self.request_body(messages, tools)
        body["stream"] = True
        body.setdefault("stream_options", {"include_usage": True})
        return body

    def stream(self, messages: list[Message], tools: list[ToolSpec]) -> AsyncIterator[StreamPart]:
        """The reply as it is written: `TextDelta`s and `ToolCallDelta`s, then the
        `LLMResponse` `chat()` would return (see `StreamingLLM`)."""
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return self._http.stream(
            f"{self.base_url}/chat/completions",
            headers,
            self.stream_body(messages, tools),
            parse_stream,
            parse_response,
        )


def build_request(
    model: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> dict[str, Any]:
    """A Chat Completions request body for the neutral conversation."""
    body: dict[str, Any] = {"model": model, "messages": to_openai_messages(messages)}
    if tools:  # OpenAI rejects an empty `tools` list
        body["tools"] = [to_openai_tool(spec) for spec in tools]
    return body


def to_openai_messages(
    messages: Sequence[Message], *, empty_content: str | None = None
) -> list[dict[str, Any]]:
    """Neutral messages as Chat Completions messages.

    `empty_content` is what an assistant message that only calls tools
    carries as `content`: `None` (what OpenAI itself sends back) or `""` for
    servers whose schema wants a string.
    """
    out: list[dict[str, Any]] = []
    wire_ids = provider_call_ids(messages)
    for message in messages:
        if message.role == "system":
            if message.content:
                out.append({"role": "system", "content": message.content})
        elif message.role == "user":
            out.append({"role": "user", "content": message.content})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant"}
            if message.tool_calls:
                entry["content"] = message.content or empty_content
                entry["tool_calls"] = [
                    {
                        "id": call.wire_id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.arguments, ensure_ascii=False),
                        },
                    }
                    for call in message.tool_calls
                ]
            else:
                entry["content"] = message.content
            out.append(entry)
        else:
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _wire_id(wire_ids, message.tool_call_id),
                    "content": message.content,
                }
            )
    return out


def message_wire_size(entries: Sequence[Mapping[str, Any]]) -> int:
    """The bytes these entries of `messages` take in a body, each with its comma."""
    return sum(wire_size(entry) + 1 for entry in entries)


def _wire_id(wire_ids: Mapping[str, str], call_id: str | None) -> str | None:
    return wire_ids.get(call_id, call_id) if call_id is not None else None


def to_openai_tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.input_schema}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def parse_response(data: Any) -> LLMResponse:
    """The neutral reply for a Chat Completions response body."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = data.get("error") if isinstance(data, dict) else None
        if error:  # some gateways answer 200 with an error object
            raise LLMResponseError(
                f"the OpenAI-compatible server answered with an error: "
                f"{provider_message(json.dumps(data))}",
                provider="openai",
                body=str(data),
            )
        raise LLMResponseError(
            "the OpenAI-compatible server answered without `choices`; is LLM_BASE_URL a "
            "Chat Completions endpoint (it usually ends in /v1)?",
            provider="openai",
            body=str(data),
        )
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise LLMResponseError(
            "the OpenAI-compatible server answered a choice without a `message`",
            provider="openai",
            body=str(data),
        )
    return LLMResponse(
        text=_text(message.get("content")),
        tool_calls=parse_tool_calls(message.get("tool_calls")),
        usage=parse_usage(data.get("usage")),
    )


def parse_tool_calls(raw: Any) -> list[ToolCall]:
    """`tool_calls` in the OpenAI shape (`{id, function: {name, arguments}}`).

    The flat shape `{name, arguments}` some servers use is accepted too.
    """
    calls: list[ToolCall] = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, dict):
            continue
        function = item.get("function")
        source = function if isinstance(function, dict) else item
        # A call without a name is kept: the run loop answers it with "no such
        # tool", which tells the model what went wrong.
        name = str(source.get("name") or "")
        calls.append(make_tool_call(str(item.get("id") or ""), name, source.get("arguments")))
    return calls


def parse_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    return Usage(
        input_tokens=token_count(raw.get("prompt_tokens")),
        output_tokens=token_count(raw.get("completion_tokens")),
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, from some compatible servers
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


class ChunkReader:
    """Builds a reply from streamed `chat.completion.chunk` objects, one `add()` each.

    `add(chunk)` returns the deltas the chunk carries: its text, and its
    tool-call pieces by `index` (id and name with a call's first piece, the
    arguments' JSON text as it comes). `reply()` is the `LLMResponse`,
    parsed as `parse_response` parses a whole answer (same tool calls, same
    `MalformedToolCall`s, usage from the chunk that carries it). Servers
    that send a call whole (no `index`, arguments maybe an object) are
    read too.
    """

    def __init__(self, provider: str = "openai") -> None:
        self.provider = provider
        self.finished = False  # a choice said its finish_reason
        self._texts: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage: Any = None

    def add(self, chunk: Any) -> list[StreamPart]:
        if not isinstance(chunk, dict):
            raise LLMResponseError(
                f"{self.provider} streamed a {type(chunk).__name__}, not a chunk object",
                provider=self.provider,
                body=repr(chunk),
            )
        if chunk.get("error"):
            raise stream_error(self.provider, json.dumps(chunk))
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        parts: list[StreamPart] = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta", choice.get("message"))
            if isinstance(delta, dict):
                parts.extend(self.add_text(delta.get("content")))
                parts.extend(self.add_tool_calls(delta.get("tool_calls")))
            if choice.get("finish_reason"):
                self.finished = True
        return parts

    def add_text(self, content: Any) -> list[StreamPart]:
        text = _text(content)
        if not text:
            return []
        self._texts.append(text)
        return [TextDelta(text)]

    def add_tool_calls(self, raw: Any) -> list[StreamPart]:
        parts: list[StreamPart] = []
        for item in raw if isinstance(raw, list) else ():
            if not isinstance(item, dict):
                continue
            index = item.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                index = len(self._calls)  # a call sent whole, without an index
            function = item.get("function")
            source = function if isinstance(function, dict) else item
            call = self._calls.get(index)
            first = call is None
            if call is None:
                call = self._calls[index] = {"id": "", "name": "", "arguments": None}
            new_id = new_name = None
            if item.get("id") and not call["id"]:
                call["id"] = new_id = str(item["id"])
            if source.get("name") and not call["name"]:
                call["name"] = new_name = str(source["name"])
            arguments, piece = source.get("arguments"), ""
            if isinstance(arguments, str):
                if not isinstance(call["arguments"], str | None):
                    call["arguments"] = ""  # an object, then text: keep the text
                call["arguments"] = (call["arguments"] or "") + arguments
                piece = arguments
            elif arguments is not None:  # an object sent whole (already depth-checked)
                call["arguments"] = arguments
                piece = json.dumps(arguments, ensure_ascii=False)
            if first or new_id or new_name or piece:
                parts.append(ToolCallDelta(index, new_id, new_name, piece))
        return parts

    def reply(self) -> LLMResponse:
        calls = [
            {"id": call["id"], "function": {"name": call["name"], "arguments": call["arguments"]}}
            for _, call in sorted(self._calls.items())
        ]
        return LLMResponse(
            text="".join(self._texts),
            tool_calls=parse_tool_calls(calls),
            usage=parse_usage(self._usage),
        )


async def parse_stream(events: AsyncIterator[SSEEvent]) -> AsyncGenerator[StreamPart, None]:
    """Deltas, then the `LLMResponse`, from a Chat Completions stream (`data: [DONE]` ends it).

    An error object in the stream raises (see `stream_error`); a stream that
    ends before `[DONE]` is a cut (`LLMConnectionError`), unless its choice
    had already finished (some compatible servers send no `[DONE]`).
    """
    async for part in read_chunks(events, ChunkReader("openai")):
        yield part


async def read_chunks(
    events: AsyncIterator[SSEEvent], reader: ChunkReader
) -> AsyncGenerator[StreamPart, None]:
    """`parse_stream` with a given chunk reader (Workers AI brings its own)."""
    async for event in events:
        if event.data.strip() == "[DONE]":
            yield reader.reply()
            return
        if event.event == "error":
            raise stream_error(reader.provider, event.data)
        for part in reader.add(json_data(event, reader.provider)):
            yield part
    if not reader.finished:
        raise stream_cut(reader.provider, "[DONE]")
    yield reader.reply()
