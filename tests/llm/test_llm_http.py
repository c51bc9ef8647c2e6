"""Both HTTP adapters over real HTTP against a local server: retries, and errors that
say what to do."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from tests.support.llm_support import RecordingSleep, Reply, ScriptedServer, fast_retry

from durable_agents import LLMResponse, Message, Usage
from durable_agents.llm import (
    AnthropicLLM,
    LLMAuthenticationError,
    LLMConnectionError,
    LLMContextLengthError,
    LLMHTTPError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMResponseError,
    LLMTimeoutError,
    OpenAILLM,
    RetryPolicy,
)
from durable_agents.messages import MalformedToolCall

KEY = "sk-test-do-not-leak-0123456789"

ANTHROPIC_OK = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "hello"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 2},
}
OPENAI_OK = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}
EXPECTED = LLMResponse("hello", [], Usage(5, 2))

MakeLLM = Callable[..., Any]


@dataclass
class Address:
    url: str


def make_anthropic(server: ScriptedServer, **options: Any) -> AnthropicLLM:
    options.setdefault("retry", fast_retry())
    return AnthropicLLM("claude-sonnet-4-5", KEY, base_url=server.url, **options)


def make_openai(server: ScriptedServer, **options: Any) -> OpenAILLM:
    options.setdefault("retry", fast_retry())
    return OpenAILLM("gpt-4.1-mini", KEY, base_url=server.url + "/v1", **options)


PROVIDERS = {"anthropic": (make_anthropic, ANTHROPIC_OK), "openai": (make_openai, OPENAI_OK)}


@pytest.fixture(params=list(PROVIDERS))
def provider(request: pytest.FixtureRequest) -> tuple[MakeLLM, dict[str, Any]]:
    return PROVIDERS[request.param]


@pytest.fixture
def serve() -> Iterator[Callable[[list[Reply]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(replies: list[Reply]) -> ScriptedServer:
        server = ScriptedServer(replies).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


async def ask(llm: Any) -> LLMResponse:
    try:
        reply: LLMResponse = await llm.chat([Message.system("s"), Message.user("hi")], [])
        return reply
    finally:
        await llm.aclose()


async def test_429_with_retry_after_is_waited_out_then_succeeds(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve(
        [
            Reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "2"}),
            Reply(ok),
        ]
    )
    sleep = RecordingSleep()
    assert await ask(make(server, retry=fast_retry(sleep=sleep))) == EXPECTED
    assert sleep.waits == [2.0]
    assert len(server.requests) == 2


async def test_retry_after_ms_wins_over_retry_after(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    headers = {"retry-after": "2", "retry-after-ms": "250"}
    server = serve([Reply({}, status=429, headers=headers), Reply(ok)])
    sleep = RecordingSleep()
    assert await ask(make(server, retry=fast_retry(sleep=sleep))) == EXPECTED
    assert sleep.waits == [0.25]


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_retried_then_succeed(
    status: int,
    provider: tuple[MakeLLM, dict[str, Any]],
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    make, ok = provider
    server = serve([Reply({"error": {"message": "overloaded"}}, status=status), Reply(ok)])
    assert await ask(make(server)) == EXPECTED
    assert len(server.requests) == 2


async def test_a_dropped_connection_is_retried_then_succeeds(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve([Reply(drop=True), Reply(drop=True), Reply(ok)])
    assert await ask(make(server)) == EXPECTED
    assert len(server.requests) == 3


async def test_a_timeout_is_retried_then_succeeds(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve([Reply(ok, delay=2.0), Reply(ok)])
    assert await ask(make(server, timeout=0.2)) == EXPECTED
    assert len(server.requests) == 2


async def test_every_attempt_timing_out_raises_a_timeout_error(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve([Reply(ok, delay=2.0), Reply(ok, delay=2.0)])
    with pytest.raises(LLMTimeoutError, match="timeout=") as caught:
        await ask(make(server, timeout=0.1, retry=fast_retry(max_attempts=2)))
    assert caught.value.attempts == 2
    assert caught.value.code == "llm-timeout"


async def test_401_fails_at_once_naming_the_setting_and_not_the_key(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    body = {"type": "error", "error": {"type": "authentication_error", "message": f"bad {KEY}"}}
    server = serve([Reply(body, status=401), Reply(ok)])
    with pytest.raises(LLMAuthenticationError) as caught:
        await ask(make(server))
    error = caught.value
    assert len(server.requests) == 1
    assert error.status_code == 401
    assert error.attempts == 1
    assert error.retryable is False
    assert error.code == "llm-authentication"
    assert "LLM_API_KEY" in str(error)
    assert "authentication_error" in str(error)
    assert KEY not in str(error)
    assert KEY not in repr(error)
    assert KEY not in error.body
    assert json.loads(error.body)["error"]["message"] == "bad [redacted]"


@pytest.mark.parametrize(
    ("status", "body", "error_class", "hint"),
    [
        (403, {"error": {"message": "forbidden"}}, LLMAuthenticationError, "LLM_API_KEY"),
        (404, {"error": {"message": "model: nope"}}, LLMModelNotFoundError, "LLM_BASE_URL"),
        (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            },
            LLMContextLengthError,
            "too long",
        ),
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens.",
                    "code": "context_length_exceeded",
                }
            },
            LLMContextLengthError,
            "new session",
        ),
        (400, {"error": {"message": "tools.0.name: bad"}}, LLMHTTPError, "tools.0.name"),
        (422, "not json at all", LLMHTTPError, "not json at all"),
    ],
)
async def test_client_errors_fail_at_once_and_say_what_to_do(
    status: int,
    body: Any,
    error_class: type[LLMHTTPError],
    hint: str,
    provider: tuple[MakeLLM, dict[str, Any]],
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    make, ok = provider
    raw = body.encode() if isinstance(body, str) else None
    server = serve([Reply(body, status=status, raw=raw), Reply(ok)])
    with pytest.raises(error_class, match=hint) as caught:
        await ask(make(server))
    assert type(caught.value) is error_class
    assert caught.value.status_code == status
    assert len(server.requests) == 1


async def test_429_that_never_ends_raises_rate_limit_after_all_attempts(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, _ = provider
    server = serve([Reply({}, status=429, headers={"retry-after": "0"}) for _ in range(3)])
    with pytest.raises(LLMRateLimitError, match="rate limited") as caught:
        await ask(make(server, retry=fast_retry(max_attempts=3)))
    assert caught.value.attempts == 3
    assert caught.value.retry_after == 0.0
    assert not server.exhausted


async def test_a_non_json_success_is_a_response_error_not_retried(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve([Reply(raw=b"<html>proxy login</html>"), Reply(ok)])
    with pytest.raises(LLMResponseError, match="LLM_BASE_URL"):
        await ask(make(server))
    assert len(server.requests) == 1


async def test_nothing_listening_is_a_connection_error_after_retries(
    provider: tuple[MakeLLM, dict[str, Any]],
) -> None:
    make, _ = provider
    with socket.socket() as sock:  # a port that was free a moment ago and is closed now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(LLMConnectionError, match="LLM_BASE_URL") as caught:
        await ask(make(Address(f"http://127.0.0.1:{port}"), retry=fast_retry(max_attempts=2)))
    assert caught.value.attempts == 2
    assert caught.value.code == "llm-connection"


async def test_an_injected_client_is_used_and_left_open(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve([Reply(ok)])
    async with httpx.AsyncClient() as client:
        llm = make(server, client=client)
        assert await ask(llm) == EXPECTED
        assert not client.is_closed


async def test_the_default_client_is_made_lazily_and_closed(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    server = serve([Reply(ok), Reply(ok)])
    async with make(server) as llm:
        assert llm._http._client is None
        await llm.chat([Message.user("a")], [])
        await llm.chat([Message.user("b")], [])
        client = llm._http._client
    assert client is not None
    assert client.is_closed


async def test_client_and_transport_are_exclusive() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ValueError, match="client"):
            OpenAILLM("m", client=client, transport=httpx.MockTransport(lambda r: r))


def test_default_policy_is_bounded() -> None:
    retry = OpenAILLM("m").retry
    assert isinstance(retry, RetryPolicy)
    assert retry.max_attempts > 1
    assert retry.deadline < 3600


def _tool_reply(provider_name: str, arguments_json: str) -> bytes:
    """A whole (non-streamed) reply with one call of `pick`, its arguments written as
    `arguments_json` (raw text: it may hold NaN, which no JSON encoder writes)."""
    if provider_name == "anthropic":
        return (
            '{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use",'
            f'"id":"toolu_1","name":"pick","input":{arguments_json}}}],"stop_reason":"tool_use",'
            '"usage":{"input_tokens":5,"output_tokens":2}}'
        ).encode()
    return (
        '{"id":"c1","object":"chat.completion","choices":[{"index":0,"finish_reason":'
        '"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1",'
        f'"type":"function","function":{{"name":"pick","arguments":{arguments_json}}}}}]}}}}]}}'
    ).encode()


MAKERS = {"anthropic": make_anthropic, "openai": make_openai}


@pytest.mark.parametrize("provider_name", list(MAKERS))
@pytest.mark.parametrize("key", ["none", "1", "x"])
async def test_a_reply_is_read_as_sent_whatever_the_key(
    provider_name: str, key: str, serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    # A placeholder key (local OpenAI-compatible servers take any) must not be cut out of
    # what the model wrote, nor make every reply unreadable.
    text = json.dumps({"note": "set none of them aside, 1 by 1; x marks it"})
    arguments = json.dumps(text) if provider_name == "openai" else text
    server = serve([Reply(raw=_tool_reply(provider_name, arguments))])
    llm: AnthropicLLM | OpenAILLM
    if provider_name == "openai":
        llm = OpenAILLM("m", key, base_url=server.url + "/v1", retry=fast_retry())
    else:
        llm = AnthropicLLM("claude-sonnet-4-5", key, base_url=server.url, retry=fast_retry())
    reply = await ask(llm)
    (call,) = reply.tool_calls
    assert call.arguments == {"note": "set none of them aside, 1 by 1; x marks it"}


async def test_a_long_key_a_reply_holds_is_kept_there_and_out_of_errors(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    echoed = json.loads(json.dumps(ok))
    if "content" in echoed:
        echoed["content"][0]["text"] = f"the key is {KEY}"
    else:
        echoed["choices"][0]["message"]["content"] = f"the key is {KEY}"
    server = serve([Reply(echoed), Reply(raw=f"<html>{KEY}</html>".encode())])
    assert (await ask(make(server))).text == f"the key is {KEY}"  # data, passed on as sent
    with pytest.raises(LLMResponseError) as caught:
        await ask(make(server))
    assert KEY not in str(caught.value)
    assert KEY not in caught.value.body


@pytest.mark.parametrize("provider_name", list(MAKERS))
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_a_non_finite_number_in_a_whole_reply_makes_that_call_invalid(
    provider_name: str, number: str, serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    # As on the streamed path: the call is refused with a sentence for the model (the run
    # loop answers it invalid-arguments and never runs it), the rest of the reply stands.
    body = _tool_reply(provider_name, f'{{"n": {number}}}')
    server = serve([Reply(raw=body)])
    reply = await ask(MAKERS[provider_name](server))
    (call,) = reply.tool_calls
    assert isinstance(call, MalformedToolCall)
    assert call.arguments == {}
    assert "not a JSON number" in call.arguments_error


async def test_a_whole_reply_cut_off_is_retried_as_a_cut_stream_is(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    whole = json.dumps(ok).encode()
    server = serve([Reply(raw=whole[: len(whole) // 2]), Reply(ok)])
    assert await ask(make(server)) == EXPECTED
    assert len(server.requests) == 2


async def test_a_whole_reply_cut_off_every_time_is_a_connection_error(
    provider: tuple[MakeLLM, dict[str, Any]], serve: Callable[[list[Reply]], ScriptedServer]
) -> None:
    make, ok = provider
    cut = json.dumps(ok).encode()[:40]
    server = serve([Reply(raw=cut)] * 3)
    with pytest.raises(LLMConnectionError, match="broke off"):
        await ask(make(server, retry=fast_retry(max_attempts=3)))
    assert len(server.requests) == 3
