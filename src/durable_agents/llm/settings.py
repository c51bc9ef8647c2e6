"""Choosing and building the LLM from settings: `llm_from_env(env)`.

Reads `LLM_PROVIDER`, `LLM_MODEL`, `LLM_BASE_URL`, `LLM_API_KEY` and, inside a
Worker, the `AI` binding; with neither a provider nor a key it gives the
offline `demo` model, `TestLLM()`. What each setting means and its default:
docs/llm-providers.md#settings.

`llm_from_env` imports only the adapter the settings name: a Worker loads no other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ._defaults import (
    ANTHROPIC_BASE_URL,
    DEFAULT_ANTHROPIC_MODEL,
    DEFAULT_OPENAI_MODEL,
    DEFAULT_WORKERS_AI_MODEL,
    OPENAI_BASE_URL,
)

if TYPE_CHECKING:
    from .base import LLM

PROVIDERS = ("anthropic", "openai", "workers-ai", "demo")
DEFAULT_MODELS: Mapping[str, str] = {
    "anthropic": DEFAULT_ANTHROPIC_MODEL,
    "openai": DEFAULT_OPENAI_MODEL,
    "workers-ai": DEFAULT_WORKERS_AI_MODEL,
}
_ALIASES = {"workers_ai": "workers-ai", "workersai": "workers-ai", "cloudflare": "workers-ai"}


def setting(env: Any, name: str) -> Any:
    """One setting from a Mapping (`os.environ`) or an object (a Worker's `env`); None if unset.

    Empty strings count as unset, so `LLM_API_KEY=` in a .env file is no key.
    """
    if isinstance(env, Mapping):
        value = env.get(name)
    else:
        try:
            value = getattr(env, name, None)
        except Exception:  # a JS proxy may raise on a missing property
            value = None
    if isinstance(value, str):
        value = value.strip()
        return value or None
    return value


def llm_from_env(env: Any) -> LLM:
    """The LLM the settings in `env` describe (see the module docstring).

    Raises `ConfigurationError`, naming the missing or wrong setting, for an
    unknown provider, a provider that needs a key without one, or
    `workers-ai` without the `AI` binding. Nothing is contacted here.
    """
    provider = setting(env, "LLM_PROVIDER")
    model = setting(env, "LLM_MODEL")
    base_url = setting(env, "LLM_BASE_URL")
    api_key = setting(env, "LLM_API_KEY")

    if provider is None:
        if api_key is None:
            provider = "demo"
        else:
            hint = (
                " (the key looks like an Anthropic key: LLM_PROVIDER=anthropic)"
                if str(api_key).startswith("sk-ant-")
                else ""
            )
            raise ConfigurationError(
                "LLM_API_KEY is set but LLM_PROVIDER is not; set LLM_PROVIDER to one of "
                f"{', '.join(PROVIDERS)}{hint}"
            )
    name = str(provider).strip().lower()
    name = _ALIASES.get(name, name)

    if name == "demo":
        from .offline import TestLLM

        return TestLLM()
    if name == "anthropic":
        from .anthropic import AnthropicLLM

        if api_key is None:
            raise ConfigurationError(
                "LLM_PROVIDER=anthropic needs LLM_API_KEY (an Anthropic API key)"
            )
        return AnthropicLLM(
            model or DEFAULT_ANTHROPIC_MODEL,
            str(api_key),
            base_url=base_url or ANTHROPIC_BASE_URL,
        )
    if name == "openai":
        from .openai import OpenAILLM

        # Local OpenAI-compatible servers (Ollama, vLLM, llama.cpp) take no key.
        if api_key is None and base_url is None:
            raise ConfigurationError(
                "LLM_PROVIDER=openai needs LLM_API_KEY (an OpenAI API key), or LLM_BASE_URL "
                "for an OpenAI-compatible server that needs no key"
            )
        return OpenAILLM(
            model or DEFAULT_OPENAI_MODEL,
            None if api_key is None else str(api_key),
            base_url=base_url or OPENAI_BASE_URL,
        )
    if name == "workers-ai":
        from .workers_ai import WorkersAILLM

        binding = setting(env, "AI")
        if binding is None:
            raise ConfigurationError(
                "LLM_PROVIDER=workers-ai needs the Workers AI binding AI: add "
                '`[ai]` with `binding = "AI"` to wrangler.toml (it exists only inside a '
                "Worker; elsewhere use LLM_PROVIDER=openai with Workers AI's REST endpoint)"
            )
        return WorkersAILLM(binding, model or DEFAULT_WORKERS_AI_MODEL)
    raise ConfigurationError(
        f"unknown LLM_PROVIDER {provider!r}; valid providers: {', '.join(PROVIDERS)}"
    )
