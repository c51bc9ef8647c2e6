"""Anthropic's Messages API (`POST /v1/messages`) with tool use: `AnthropicLLM`.

Use it for Claude models with an Anthropic API key; for an OpenAI-compatible
server, `OpenAILLM`; inside a Worker with an `AI` binding, `WorkersAILLM`.
How the conversation maps onto the wire (system, `tool_use`, `tool_result`
turns) is in docs/llm-providers.md#what-the-adapters-do-with-the-conversation.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from .._http.sse import SSEEvent
from ..errors import ConfigurationError
from ..messages import (
    LLMResponse,
    MalformedToolCall,
    Message,
    StreamPart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    provider_call_ids,
)
from ._defaults import ANTHROPIC_BASE_URL
from ._http import HTTPAdapter, HTTPPoster, check_base_url
from ._retry import RetryPolicy
from ._stream import json_data, stream_cut, stream_error
from .base import wire_size
from .errors import LLMResponseError
from .tool_calls import is_error_result, make_tool_call, token_count

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicLLM(HTTPAdapter):
    """Claude through the Anthropic Messages API.

    `client=` (an `httpx.AsyncClient`) or `transport=` replace the HTTP layer,
    for tests or proxies; without them a client is made on first use (the
    Workers `fetch` transport under Pyodide). `retry=` sets how failed calls
    are retried (see `RetryPolicy`); `timeout=` bounds each attempt.
    `extra_body=` is merged into every request (e.g. `{"stop_sequences": ["END"]}`).
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        api_key: str,
        *,
        base_url: str = ANTHROPIC_BASE_URL,
        max_tokens: int = 4096,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ConfigurationError("AnthropicLLM needs a model name (LLM_MODEL)")
        if not api_key:
            raise ConfigurationError(
                "AnthropicLLM needs an API key: set LLM_API_KEY to your Anthropic key"
            )
        self.model = model
        self.base_url = check_base_url(base_url)
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self._api_key = api_key
        self._http = HTTPPoster(
            provider=self.provider,
            client=client,
            transport=transport,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            secret=api_key,
        )

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        """The JSON body `chat()` sends for this conversation."""
        body = build_request(self.model, messages, tools, max_tokens=self.max_tokens)
        body.update(self.extra_body)
        return body

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        return await self._http.post_json(
            f"{self.base_url}/v1/messages",
            {"x-api-key": self._api_key, "anthropic-version": ANTHROPIC_VERSION},
            self.request_body(messages, tools),
            parse_response,
        )

    def request_size(self, tools: Sequence[ToolSpec]) -> int:
        """The bytes of a request without messages (`SizedLLM`): `stream()`'s, the larger."""
        return wire_size(self.stream_body([], tools))

    def message_size(self, message: Message) -> int:
        """The bytes `message` adds to a request (`SizedLLM`): a system message its part of
        the `system` string (and the key, and the blank line that joins it); any other a
        turn of its own, with its comma (the same or less when it joins the turn before)."""
        if message.role == "system":
            if not message.content:
                return 0
            return wire_size(message.content) + len(',"system":') + len(r"\n\n")
        blocks = _blocks(message, {})
        if not blocks:
            return 0
        role = "assistant" if message.role == "assistant" else "user"
        return wire_size({"role": role, "content": blocks}) + 1

    def stream_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The JSON body `stream()` sends: `chat()`'s with `"stream": true`."""
        return {**self.request_body(messages, tools), "stream": True}

    def stream(self, messages: list[Message], tools: list[ToolSpec]) -> AsyncIterator[StreamPart]:
        """The reply as it is written: `TextDelta`s and `ToolCallDelta`s, then the
        `LLMResponse` `chat()` would return (see `StreamingLLM`)."""
        return self._http.stream(
            f"{self.base_url}/v1/messages",
            {"x-api-key": self._api_key, "anthropic-version": ANTHROPIC_VERSION},
            self.stream_body(messages, tools),
            parse_stream,
            parse_response,
        )


def build_request(
    model: str, messages: Sequence[Message], tools: Sequence[ToolSpec], *, max_tokens: int
) -> dict[str, Any]:
    """A Messages API request body for the neutral conversation."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    turns: list[dict[str, Any]] = []
    wire_ids = provider_call_ids(messages)
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message, wire_ids)
        if not blocks:
            continue  # the API rejects empty turns and empty text blocks
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = [_tool(spec) for spec in tools]
    return body


def _blocks(message: Message, wire_ids: Mapping[str, str]) -> list[dict[str, Any]]:
    if message.role == "tool":
        call_id = message.tool_call_id or ""
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": wire_ids.get(call_id, call_id),
        }
        if message.content:
            block["content"] = message.content
        if is_error_result(message.content):
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    # Whitespace-only text blocks are rejected by the API.
    if message.content.strip():
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.wire_id, "name": call.name, "input": call.arguments}
        )
    return blocks


def _tool(spec: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.input_schema}
    if spec.description:
        tool["description"] = spec.description
    return tool


def parse_response(data: Any) -> LLMResponse:
    """The neutral reply for a Messages API response body."""
    content = data.get("content") if isinstance(data, dict) else None
    if not isinstance(content, list):
        raise LLMResponseError(
            "anthropic answered without a `content` list; is LLM_BASE_URL an Anthropic "
            "Messages API endpoint?",
            provider="anthropic",
            body=str(data),
        )
    return _reply(content, data.get("stop_reason"), data.get("usage"))


def _reply(
    content: list[Any], stop_reason: Any, usage: Any, raw_inputs: Mapping[int, str] | None = None
) -> LLMResponse:
    """The neutral reply for a message's content blocks. `raw_inputs` holds, by
    position, the JSON text of a streamed tool_use block's input, not yet parsed."""
    raw_inputs = raw_inputs or {}
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id, name = str(block.get("id") or ""), str(block.get("name") or "")
            arguments = block.get("input")
            cut_off = stop_reason == "max_tokens" and index == len(content) - 1
            if index in raw_inputs and not cut_off:
                # Streamed: parsed as the OpenAI adapter parses its JSON-string
                # arguments (broken or too-deep JSON becomes a MalformedToolCall).
                calls.append(make_tool_call(call_id, name, raw_inputs[index]))
            elif cut_off or not isinstance(arguments, dict):
                # A call cut off at max_tokens may hold half its arguments; never run it.
                calls.append(
                    MalformedToolCall(
                        call_id,
                        name,
                        {},
                        raw_arguments=raw_inputs.get(index, repr(arguments)),
                        arguments_error=(
                            f"The call to tool {name!r} was cut off (the reply hit max_tokens) "
                            "or had no argument object, so the tool was not run. Call it again, "
                            "more briefly."
                        ),
                    )
                )
            else:
                calls.append(ToolCall(call_id, name, arguments))
    return LLMResponse(text="".join(texts), tool_calls=calls, usage=_usage(usage))


async def parse_stream(events: AsyncIterator[SSEEvent]) -> AsyncGenerator[StreamPart, None]:
    """Deltas, then the `LLMResponse`, from a Messages API event stream.

    Follows message_start, content_block_start/delta/stop (text_delta,
    input_json_delta; other deltas such as thinking are skipped, as
    `parse_response` skips their blocks), message_delta (stop reason, usage)
    and message_stop; an `error` event raises (see `stream_error`), and a
    stream that ends before message_stop is a cut (`LLMConnectionError`).
    """
    reader = _StreamReader()
    async for event in events:
        if event.event == "ping":
            continue
        if event.event == "error":
            raise stream_error("anthropic", event.data)
        data = json_data(event, "anthropic")
        if not isinstance(data, dict):
            raise _bad_event(event)
        if data.get("type", event.event) == "message_stop":
            yield reader.reply()
            return
        for part in reader.read(event, data):
            yield part
    raise stream_cut("anthropic", "message_stop")


class _StreamReader:
    """What a Messages API event stream has said so far: its content blocks, each
    tool_use block's input JSON, the usage and the stop reason."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}  # by the stream's block index
        self.partial: dict[int, str] = {}  # a tool_use block's input JSON so far
        self.call_index: dict[int, int] = {}  # block index -> the call's place in the reply
        self.usage: dict[str, Any] = {}
        self.stop_reason: Any = None

    def read(self, event: SSEEvent, data: dict[str, Any]) -> list[StreamPart]:
        """The deltas one event (other than message_stop) adds."""
        kind = data.get("type", event.event)
        if kind == "error":
            raise stream_error("anthropic", event.data)
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                _merge_usage(self.usage, message.get("usage"))
                self.stop_reason = message.get("stop_reason") or self.stop_reason
        elif kind == "content_block_start":
            return self.block_start(event, data)
        elif kind == "content_block_delta":
            return self.block_delta(event, data)
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                self.stop_reason = delta.get("stop_reason") or self.stop_reason
            _merge_usage(self.usage, data.get("usage"))
        # content_block_stop and event types added later need nothing
        return []

    def block_start(self, event: SSEEvent, data: dict[str, Any]) -> list[StreamPart]:
        index, block = data.get("index"), data.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            raise _bad_event(event)
        self.blocks[index] = dict(block)
        if block.get("type") == "tool_use":
            self.call_index[index] = len(self.call_index)
            self.partial[index] = ""
            call_id, name = str(block.get("id") or ""), str(block.get("name") or "")
            return [ToolCallDelta(self.call_index[index], call_id, name)]
        text = block.get("text")
        if block.get("type") == "text" and isinstance(text, str) and text:
            return [TextDelta(text)]
        return []

    def block_delta(self, event: SSEEvent, data: dict[str, Any]) -> list[StreamPart]:
        index, delta = data.get("index"), data.get("delta")
        if not isinstance(delta, dict) or index not in self.blocks:
            raise _bad_event(event)
        block = self.blocks[index]
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = str(block.get("text") or "") + delta["text"]
            return [TextDelta(delta["text"])] if delta["text"] else []
        if delta.get("type") == "input_json_delta" and index in self.partial:
            piece = delta.get("partial_json")
            if isinstance(piece, str) and piece:
                self.partial[index] += piece
                return [ToolCallDelta(self.call_index[index], arguments=piece)]
        return []

    def reply(self) -> LLMResponse:
        """The whole reply, at message_stop."""
        order = sorted(self.blocks)
        raw_inputs = {
            position: self.partial[index]
            for position, index in enumerate(order)
            if self.partial.get(index)
        }
        content = [self.blocks[index] for index in order]
        return _reply(content, self.stop_reason, self.usage or None, raw_inputs)


def _merge_usage(usage: dict[str, Any], raw: Any) -> None:
    # message_delta's counts are cumulative: they replace message_start's.
    if isinstance(raw, dict):
        usage.update({key: value for key, value in raw.items() if value is not None})


def _bad_event(event: SSEEvent) -> LLMResponseError:
    return LLMResponseError(
        f"anthropic streamed a {event.event!r} event that does not fit the Messages API; "
        "is LLM_BASE_URL an Anthropic Messages API endpoint?",
        provider="anthropic",
        body=event.data,
    )


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    # Cached prompt tokens are reported apart from `input_tokens`; all were read.
    input_tokens = sum(
        token_count(raw.get(key))
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return Usage(input_tokens=input_tokens, output_tokens=token_count(raw.get("output_tokens")))
