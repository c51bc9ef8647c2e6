"""llm_from_env: settings from os.environ-style mappings and from a Worker's env object;
the public surface of durable_agents.llm."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

import durable_agents.llm as llm_package
from durable_agents import ConfigurationError, DurableAgentsError
from durable_agents._http import client as client_module
from durable_agents.cloudflare import FetchTransport
from durable_agents.llm import (
    DEFAULT_MODELS,
    PROVIDERS,
    AnthropicLLM,
    LLMAuthenticationError,
    LLMConnectionError,
    LLMContextLengthError,
    LLMError,
    LLMHTTPError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMResponseError,
    LLMTimeoutError,
    OpenAILLM,
    TestLLM,
    WorkersAILLM,
    default_client,
    llm_from_env,
)

KEY = "sk-ant-api03-secret-0123456789"


class WorkerEnv:
    """A Worker's env: settings are attributes; a missing one raises, like a JS proxy."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


class FakeAI:
    async def run(self, model: str, inputs: Any) -> Any:
        return {"response": "hi"}


def both_forms(**values: Any) -> list[Any]:
    return [dict(values), WorkerEnv(**values)]


@pytest.mark.parametrize("env", both_forms(LLM_PROVIDER="anthropic", LLM_API_KEY=KEY))
def test_anthropic_with_default_model(env: Any) -> None:
    llm = llm_from_env(env)
    assert isinstance(llm, AnthropicLLM)
    assert llm.model == DEFAULT_MODELS["anthropic"]
    assert llm.base_url == "https://api.anthropic.com"
    assert KEY not in repr(llm)


@pytest.mark.parametrize(
    "env",
    both_forms(
        LLM_PROVIDER=" Anthropic ",
        LLM_API_KEY=KEY,
        LLM_MODEL="claude-haiku-4-5",
        LLM_BASE_URL="https://gateway.example/anthropic/",
    ),
)
def test_model_and_base_url_are_honoured(env: Any) -> None:
    llm = llm_from_env(env)
    assert isinstance(llm, AnthropicLLM)
    assert (llm.model, llm.base_url) == ("claude-haiku-4-5", "https://gateway.example/anthropic")


@pytest.mark.parametrize("env", both_forms(LLM_PROVIDER="openai", LLM_API_KEY="sk-proj-1"))
def test_openai(env: Any) -> None:
    llm = llm_from_env(env)
    assert isinstance(llm, OpenAILLM)
    assert (llm.model, llm.base_url) == (DEFAULT_MODELS["openai"], "https://api.openai.com/v1")


def test_openai_compatible_server_without_a_key() -> None:
    env = {
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": "http://localhost:11434/v1",
        "LLM_MODEL": "qwen3",
    }
    llm = llm_from_env(env)
    assert isinstance(llm, OpenAILLM)
    assert (llm.model, llm.base_url) == ("qwen3", "http://localhost:11434/v1")


@pytest.mark.parametrize("provider", ["workers-ai", "workers_ai"])
def test_workers_ai_uses_the_binding(provider: str) -> None:
    ai = FakeAI()
    llm = llm_from_env(WorkerEnv(LLM_PROVIDER=provider, AI=ai))
    assert isinstance(llm, WorkersAILLM)
    assert llm.binding is ai
    assert llm.model == DEFAULT_MODELS["workers-ai"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLM_PROVIDER": "anthropic"}, "LLM_PROVIDER=anthropic needs LLM_API_KEY"),
        ({"LLM_PROVIDER": "anthropic", "LLM_API_KEY": "  "}, "needs LLM_API_KEY"),
        ({"LLM_PROVIDER": "openai"}, "LLM_PROVIDER=openai needs LLM_API_KEY"),
        ({"LLM_PROVIDER": "workers-ai"}, "binding AI"),
        ({"LLM_PROVIDER": "gemini", "LLM_API_KEY": "k"}, "anthropic, openai, workers-ai, demo"),
        ({"LLM_API_KEY": KEY}, "LLM_PROVIDER=anthropic"),
        ({"LLM_API_KEY": "sk-proj-x"}, "LLM_PROVIDER is not"),
    ],
)
def test_misconfiguration_names_the_setting(env: dict[str, str], message: str) -> None:
    for form in (env, WorkerEnv(**env)):
        with pytest.raises(ConfigurationError, match=message) as caught:
            llm_from_env(form)
        assert KEY not in str(caught.value)


def test_nothing_set_means_the_offline_test_llm() -> None:
    for env in ({}, {"LLM_PROVIDER": "demo", "LLM_API_KEY": ""}, WorkerEnv(), WorkerEnv(AI=None)):
        assert isinstance(llm_from_env(env), TestLLM)


async def test_default_client_is_plain_httpx_on_cpython() -> None:
    async with default_client(5.0) as client:
        assert isinstance(client, httpx.AsyncClient)
        assert not isinstance(client._transport, FetchTransport)
        assert client.timeout.read == 5.0


async def test_default_client_takes_the_transport_it_is_given() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"ok": True}))
    async with default_client(5.0, transport) as client:
        assert client._transport is transport
        assert (await client.get("http://x/")).json() == {"ok": True}


async def test_the_default_transport_is_what_the_worker_side_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "_default_transport", None)
    monkeypatch.setattr(sys, "platform", "emscripten")
    with pytest.raises(ConfigurationError, match="FetchTransport"):
        default_client(7.0)
    client_module.set_default_transport(FetchTransport)
    async with default_client(7.0) as client:
        assert isinstance(client._transport, FetchTransport)
    llm = OpenAILLM("m", "k")
    assert isinstance(llm._http.client._transport, FetchTransport)
    await llm.aclose()
    given = httpx.MockTransport(lambda request: httpx.Response(204))
    async with default_client(7.0, given) as client:
        assert client._transport is given


def test_importing_cloudflare_under_pyodide_makes_fetch_the_default() -> None:
    code = (
        "import sys\n"
        "from durable_agents._http import client as _http\n"
        "assert 'durable_agents.cloudflare' not in sys.modules\n"
        "assert _http._default_transport is None\n"
        "sys.platform = 'emscripten'\n"
        "import durable_agents.cloudflare as cf\n"
        "assert _http._default_transport is cf.FetchTransport, _http._default_transport\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_llm_error_is_a_durable_agents_error_with_a_stable_code() -> None:
    classes = [
        LLMError,
        LLMHTTPError,
        LLMAuthenticationError,
        LLMModelNotFoundError,
        LLMContextLengthError,
        LLMRateLimitError,
        LLMConnectionError,
        LLMTimeoutError,
        LLMResponseError,
    ]
    codes = [cls.code for cls in classes]
    assert len(set(codes)) == len(codes)
    assert all(code.startswith("llm") for code in codes)
    assert all(issubclass(cls, DurableAgentsError) for cls in classes)
    assert issubclass(LLMTimeoutError, LLMConnectionError)
    assert all(issubclass(cls, LLMHTTPError) for cls in classes[2:5])


def test_public_names() -> None:
    exported = set(llm_package.__all__)
    assert exported >= {
        name
        for name, value in vars(llm_package).items()
        if not name.startswith("_") and not isinstance(value, type(sys))
    }
    # The adapters, offline models and client are there too, loaded on first use.
    assert all(getattr(llm_package, name) is not None for name in exported)
    assert {"AnthropicLLM", "OpenAILLM", "WorkersAILLM", "llm_from_env", "RetryPolicy"} <= exported
    assert set(PROVIDERS) == {"anthropic", "openai", "workers-ai", "demo"}
