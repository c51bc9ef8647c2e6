"""The kit's errors for a user's mistakes sit under the one root and stay `ValueError`s."""

from __future__ import annotations

import inspect

import httpx
import pytest

import durable_agents
import durable_agents.errors
import durable_agents.llm
from durable_agents import ConfigurationError, DurableAgentsError, ToolArgumentsError, tool
from durable_agents.llm import RetryPolicy
from durable_agents.llm._http import HTTPPoster
from durable_agents.stores._appends import append_rows


def test_a_bad_retry_policy_is_a_configuration_error() -> None:
    for bad in ({"max_attempts": 0}, {"deadline": 0}, {"base_delay": -1}):
        with pytest.raises(ConfigurationError) as caught:
            RetryPolicy(**bad)  # type: ignore[arg-type]
        assert isinstance(caught.value, ValueError)
        assert caught.value.code == "configuration"


async def test_client_and_transport_together_is_a_configuration_error() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ConfigurationError, match="either client= or transport="):
            HTTPPoster(
                provider="openai",
                client=client,
                transport=httpx.MockTransport(lambda request: httpx.Response(200)),
                timeout=1.0,
                retry=RetryPolicy.none(),
                secret=None,
            )


def test_bad_arguments_are_a_tool_arguments_error_naming_the_tool() -> None:
    lookup = tool(
        name="lookup",
        description="Look an order up.",
        input={"properties": {"id": {"type": "integer"}}, "required": ["id"]},
    )
    with pytest.raises(ToolArgumentsError) as caught:
        lookup.parse_arguments({"id": "seven"})
    error = caught.value
    assert isinstance(error, DurableAgentsError)
    assert isinstance(error, ValueError)
    assert error.code == "invalid-arguments"
    assert error.tool_name == "lookup"
    assert str(error) == error.problems == "arguments.id: expected integer, got string"


def test_an_empty_append_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="at least one message"):
        append_rows("s", 0, [], now_ms=0)


def _public_errors() -> list[type[DurableAgentsError]]:
    found = []
    for module in (durable_agents, durable_agents.llm):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, DurableAgentsError):
                found.append(value)
    return found


def test_the_error_tree_drawing_names_every_public_error_and_its_code() -> None:
    drawing = durable_agents.errors.__doc__ or ""
    for error in _public_errors():
        if error.__module__ == "durable_agents.llm.errors" and error.__name__ != "LLMError":
            continue  # the LLM family is drawn in durable_agents.llm.errors
        assert error.__name__ in drawing, error
        assert f'"{error.code}"' in drawing, error
        # "(ValueError)" marks where the tree meets ValueError; subclasses inherit it.
        marked = any(f"{base.__name__} (ValueError)" in drawing for base in error.__mro__)
        assert marked == issubclass(error, ValueError), error
