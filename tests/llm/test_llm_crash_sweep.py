"""The crash sweep (tests/support/crash_sweep.py) with each real adapter in the loop.

The model is still `crash_sweep.policy`, but it sits behind a fake provider:
each request is validated against the provider's request schema, decoded from
the wire format back into neutral messages, answered by the policy, and
encoded in the provider's response format (provider-generated ids for the
calls the policy leaves without one). Every FAIL_EVERY-th request fails once
with a transient error, so the adapters retry inside the sweep; a retry must
resend the very same request, and the sweep's invariants show that neither a
retry nor a crash ever repeats a tool: the LLM side of both is a repeated call.

The HTTP adapters talk to an `httpx.MockTransport` (a real socket is covered in
test_llm_full_run.py); `WorkersAILLM` to a fake `env.AI` binding.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from anthropic.types import Message as AnthropicMessage
from openai.types.chat import ChatCompletion
from pydantic import BaseModel
from tests.support.crash_sweep import policy, sweep
from tests.support.llm_support import fast_retry, validate_request

from durable_agents import LLM, LLMResponse, Message, ToolCall
from durable_agents.llm import AnthropicLLM, OpenAILLM, WorkersAILLM
from durable_agents.stores import Store

KEY = "sk-test-0123456789"
FAIL_EVERY = 7  # request n fails when n % FAIL_EVERY == 0; its retry (n + 1) succeeds


def checked(model: type[BaseModel], reply: dict[str, Any]) -> dict[str, Any]:
    """`reply`, once the official SDK's response model accepts it (the fakes answer faithfully)."""
    model.model_validate(reply, strict=True)
    return reply


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


# ---------------------------------------------------------------- decoders (wire → neutral)


def check_call_ids(
    messages: list[Message], assistant_index: int, results: list[Message], seen: set[str]
) -> None:
    """The provider's rules: call ids are non-empty and unique in the conversation, and an
    assistant message's calls are answered right after it, one result per call."""
    calls = messages[assistant_index].tool_calls
    ids = [c.id for c in calls]
    assert all(ids), ids
    assert len(set(ids)) == len(ids), ids
    assert not seen & set(ids), ids
    seen.update(ids)
    assert sorted(m.tool_call_id or "" for m in results) == sorted(ids), (ids, results)


def anthropic_conversation(body: dict[str, Any]) -> list[Message]:
    """A Messages API request as the neutral conversation."""
    messages = [Message.system(body["system"])] if body.get("system") else []
    names: dict[str, str] = {}
    seen: set[str] = set()
    pending: int | None = None  # index of the assistant message whose calls await results
    for turn in body["messages"]:
        blocks = turn["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if turn["role"] == "assistant":
            assert pending is None, "a tool_use turn must be followed by its tool_result turn"
            text = "".join(b["text"] for b in blocks if b["type"] == "text")
            uses = [b for b in blocks if b["type"] == "tool_use"]
            calls = [ToolCall(b["id"], b["name"], b["input"]) for b in uses]
            assert len(calls) + (1 if text else 0) == len(blocks), blocks
            names.update((c.id, c.name) for c in calls)
            messages.append(Message.assistant(text, calls))
            pending = len(messages) - 1 if calls else None
            continue
        results: list[Message] = []
        for index, block in enumerate(blocks):
            if block["type"] == "tool_result":
                # the API wants the results first in the turn that follows the calls
                assert pending is not None, blocks
                assert index == len(results), blocks
                call_id, content = block["tool_use_id"], block.get("content", "")
                is_error = content.startswith("{") and "error" in json.loads(content)
                assert block.get("is_error", False) == is_error, block
                results.append(
                    Message("tool", content, tool_call_id=call_id, tool_name=names.get(call_id))
                )
            else:
                assert block["type"] == "text", block
                messages.append(Message.user(block["text"]))
        if pending is not None:
            check_call_ids(messages, pending, results, seen)
            messages[pending + 1 : pending + 1] = results
            pending = None
    assert pending is None, "the last tool_use turn has no tool_result turn"
    return messages


def openai_conversation(wire: list[dict[str, Any]]) -> list[Message]:
    """Chat Completions messages (or Workers AI's, which share the shape) as neutral ones."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    seen: set[str] = set()
    pending: int | None = None
    results: list[Message] = []

    def close_step() -> None:
        nonlocal pending, results
        if pending is not None:
            check_call_ids(messages, pending, results, seen)
        pending, results = None, []

    for entry in wire:
        role = entry["role"]
        if role == "tool":
            assert pending is not None, "a tool message must follow an assistant's tool_calls"
            call_id = entry["tool_call_id"]
            if "name" in entry:
                assert entry["name"] == names[call_id], entry
            result = Message(
                "tool", entry["content"], tool_call_id=call_id, tool_name=names[call_id]
            )
            messages.append(result)
            results.append(result)
            continue
        close_step()
        if role == "assistant":
            calls = [
                ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in entry.get("tool_calls", ())
            ]
            names.update((c.id, c.name) for c in calls)
            messages.append(Message.assistant(entry.get("content") or "", calls))
            pending = len(messages) - 1 if calls else None
        else:
            assert role in ("system", "user"), entry
            messages.append(Message(role, entry["content"]))
    close_step()
    return messages


def validate_workers_ai_inputs(inputs: dict[str, Any]) -> None:
    """Workers AI's chat input is the Chat Completions shape (every content a string, the
    tool's name on tool messages): validate it strictly as that, less the model name."""
    assert set(inputs) <= {"messages", "tools"}, inputs
    assert all(isinstance(m["content"], str) for m in inputs["messages"]), inputs
    as_openai = [
        {k: v for k, v in m.items() if not (m["role"] == "tool" and k == "name")}
        for m in inputs["messages"]
    ]
    validate_request("openai", {"model": "m", **inputs, "messages": as_openai})


# ---------------------------------------------------------------- the fake providers


class FakeProvider:
    """Plays one provider for a whole sweep. Subclasses encode the replies and failures."""

    id_prefix = "gen"

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.retry_mismatches: list[str] = []
        self.repeated_calls = 0  # a request already answered once: a crash's LLM side
        self._failed: str | None = None
        self._answered: set[str] = set()
        self._ids = itertools.count(1)

    def fails(self, body: Any) -> bool:
        """Count the request; True if this one is to fail (it is then retried)."""
        self.requests += 1
        key = canonical(body)
        if self._failed is not None and key != self._failed:
            self.retry_mismatches.append(f"request {self.requests} retried a different body")
        self._failed = None
        if self.requests % FAIL_EVERY == 0:
            self.failures += 1
            self._failed = key
            return True
        return False

    def answer(self, body: Any, conversation: list[Message]) -> LLMResponse:
        key = canonical(body)
        if any(m.role == "assistant" for m in conversation) and key in self._answered:
            self.repeated_calls += 1
        self._answered.add(key)
        return policy(conversation)

    def call_id(self, call: ToolCall) -> str:
        return call.id or f"{self.id_prefix}{next(self._ids)}"


class FakeAnthropic(FakeProvider):
    id_prefix = "toolu_fake"

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/messages"
        assert request.headers["x-api-key"] == KEY
        body = json.loads(request.content)
        validate_request("anthropic", body)
        if self.fails(body):
            return self.failure()
        reply = self.answer(body, anthropic_conversation(body))
        blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        blocks += [
            {"type": "tool_use", "id": self.call_id(c), "name": c.name, "input": c.arguments}
            for c in reply.tool_calls
        ]
        return httpx.Response(
            200,
            json=checked(
                AnthropicMessage,
                {
                    "id": f"msg_fake{self.requests}",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": blocks,
                    "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10 * len(body["messages"]), "output_tokens": 5},
                },
            ),
        )

    def failure(self) -> httpx.Response:
        kind = self.failures % 4
        if kind == 0:
            raise httpx.ReadError("connection reset after the request was sent")
        status, error, headers = [
            (529, "overloaded_error", {}),
            (500, "api_error", {}),
            (429, "rate_limit_error", {"retry-after": "0"}),
        ][kind - 1]
        payload = {"type": "error", "error": {"type": error, "message": "try again"}}
        return httpx.Response(status, json=payload, headers=headers)


class FakeOpenAI(FakeProvider):
    id_prefix = "call_fake"

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        assert request.headers["authorization"] == f"Bearer {KEY}"
        body = json.loads(request.content)
        validate_request("openai", body)
        if self.fails(body):
            return self.failure()
        reply = self.answer(body, openai_conversation(body["messages"]))
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self.call_id(c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in reply.tool_calls
            ]
        return httpx.Response(
            200,
            json=checked(
                ChatCompletion,
                {
                    "id": f"chatcmpl-fake{self.requests}",
                    "object": "chat.completion",
                    "created": 1_700_000_000,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
                },
            ),
        )

    def failure(self) -> httpx.Response:
        kind = self.failures % 4
        if kind == 0:
            raise httpx.ConnectError("connection refused")
        status, headers = [(503, {}), (500, {}), (429, {"retry-after-ms": "1"})][kind - 1]
        payload = {"error": {"message": "try again", "type": "server_error", "code": None}}
        return httpx.Response(status, json=payload, headers=headers)


class FakeAIBinding(FakeProvider):
    """`env.AI`: answers in each of the three result shapes Workers AI models use, in turn."""

    id_prefix = "chatcmpl-tool-fake"

    async def run(self, model: str, inputs: Any) -> Any:
        inputs = json.loads(json.dumps(inputs))  # what crosses into JS is a copy
        validate_workers_ai_inputs(inputs)
        if self.fails(inputs):
            raise RuntimeError(
                [
                    "AiError: 3040: Capacity temporarily exceeded, please try again.",
                    "AiError: 3007: Request timeout",
                    "InferenceUpstreamError: internal server error",
                ][self.failures % 3]
            )
        reply = self.answer(inputs, openai_conversation(inputs["messages"]))
        usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        openai_calls = [
            {
                "id": self.call_id(c),
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in reply.tool_calls
        ]
        shape = self.requests % 3
        if shape == 0:  # traditional: flat calls, no ids at all (the loop assigns them)
            flat = [{"name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
            return {"response": reply.text or None, "tool_calls": flat, "usage": usage}
        if shape == 1:  # traditional with OpenAI-style calls
            return {"response": reply.text, "tool_calls": openai_calls, "usage": usage}
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if openai_calls:
            message["tool_calls"] = openai_calls
        return {"choices": [{"index": 0, "message": message}], "usage": usage}


# ---------------------------------------------------------------- the sweeps


@asynccontextmanager
async def adapter(fake: FakeProvider) -> AsyncIterator[Callable[[], LLM]]:
    """A factory for a fresh adapter per `run()` (as after a restart) over `fake`."""
    if isinstance(fake, FakeAIBinding):
        model = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
        yield lambda: WorkersAILLM(fake, model, retry=fast_retry())
        return
    assert isinstance(fake, FakeAnthropic | FakeOpenAI)
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client:
        if isinstance(fake, FakeAnthropic):
            yield lambda: AnthropicLLM("claude-sonnet-4-5", KEY, client=client, retry=fast_retry())
        else:
            url = "https://api.test/v1"
            yield lambda: OpenAILLM(
                "gpt-4.1-mini", KEY, base_url=url, client=client, retry=fast_retry()
            )


FAKES: dict[str, Callable[[], FakeProvider]] = {
    "anthropic": FakeAnthropic,
    "openai": FakeOpenAI,
    "workers-ai": FakeAIBinding,
}


@pytest.mark.parametrize("provider", list(FAKES))
async def test_crash_sweep_through_each_adapter(
    provider: str, durable_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FAKES[provider]()
    started = time.perf_counter()
    async with adapter(fake) as llm_factory:
        report = await sweep(durable_store, prefix=f"sweep-{provider}", llm_factory=llm_factory)
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"\n  crash sweep through {provider} on {type(durable_store).__name__}: {report}; "
            f"{fake.requests} LLM requests, {fake.failures} transient failures retried, "
            f"{fake.repeated_calls} repeated calls after a crash ({elapsed:.2f} s)"
        )
    assert report.scenarios == 2 * (report.baseline_appends + report.baseline_handler_calls)
    assert fake.failures >= report.scenarios // 2, "too few transient failures to matter"
    assert fake.retry_mismatches == []
    assert fake.repeated_calls > 0, "no crash made the loop ask the model again"
