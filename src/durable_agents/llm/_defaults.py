"""The providers' default models and API URLs: what `llm_from_env` and each adapter fall
back to. A module of their own so that the settings name them without importing the
adapters (`llm_from_env` imports only the one the settings name), and the adapters take
theirs from one place. Guide: docs/llm-providers.md#settings.
"""

from __future__ import annotations

__all__ = [
    "ANTHROPIC_BASE_URL",
    "DEFAULT_ANTHROPIC_MODEL",
    "DEFAULT_OPENAI_MODEL",
    "DEFAULT_WORKERS_AI_MODEL",
    "OPENAI_BASE_URL",
]

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"
DEFAULT_WORKERS_AI_MODEL = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
