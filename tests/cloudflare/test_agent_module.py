"""The agent-module protocol (`durable_agents.cloudflare.agent_module`): what
`src/entry.py` reads from `src/agent.py`, and what a mistake there says."""

from __future__ import annotations

import types
from typing import Any

import httpx
import pytest
from examples.refunds import agent as refunds
from examples.triage import agent as triage

from durable_agents import Agent, ConfigurationError
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.llm import llm_from_env


def module(**names: Any) -> types.ModuleType:
    made = types.ModuleType("agent")
    made.__file__ = "src/agent.py"
    for name, value in names.items():
        setattr(made, name, value)
    return made


AGENT = Agent("a")


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None


def test_the_least_a_module_defines_is_an_agent_and_make_deps() -> None:
    loaded = AgentModule.load(module(AGENT=AGENT, make_deps=make_deps))
    assert loaded.agent is AGENT
    assert loaded.make_deps is make_deps
    assert loaded.make_llm is llm_from_env
    assert not loaded.has_own_llm
    assert (loaded.settings, dict(loaded.dev_stubs)) == ((), {})
    assert loaded.describe() == {"agent": "a", "settings": [], "dev_stubs": [], "make_llm": False}


def test_the_examples_follow_the_protocol() -> None:
    assert AgentModule.load(triage).describe() == {
        "agent": "triage",
        "settings": ["ISSUES_API_URL", "SLACK_WEBHOOK_URL"],
        "dev_stubs": ["ISSUES_API_URL", "SLACK_WEBHOOK_URL"],
        "make_llm": True,
    }
    assert AgentModule.load(refunds).describe() == {
        "agent": "refunds",
        "settings": ["PAYMENTS_API_URL"],
        "dev_stubs": ["PAYMENTS_API_URL"],
        "make_llm": True,
    }


def stub(method: str, path: str, body: bytes, headers: Any) -> tuple[int, Any]:
    return 200, {}


@pytest.mark.parametrize(
    ("names", "says"),
    [
        ({"make_deps": make_deps}, "must define AGENT"),
        ({"AGENT": "triage", "make_deps": make_deps}, "found str"),
        ({"AGENT": AGENT}, "must define make_deps(env, http)"),
        ({"AGENT": AGENT, "make_deps": "x"}, "make_deps must be a function"),
        ({"AGENT": AGENT, "make_deps": lambda env: None}, "make_deps must take (env, http)"),
        (
            {"AGENT": AGENT, "make_deps": make_deps, "make_llm": lambda: None},
            "make_llm must take (env)",
        ),
        ({"AGENT": AGENT, "make_deps": make_deps, "SETTINGS": "A_URL"}, "tuple of setting"),
        ({"AGENT": AGENT, "make_deps": make_deps, "SETTINGS": ("A URL",)}, "not a setting"),
        ({"AGENT": AGENT, "make_deps": make_deps, "DEV_STUBS": [stub]}, "DEV_STUBS must map"),
        ({"AGENT": AGENT, "make_deps": make_deps, "DEV_STUBS": {"A": 1}}, "must be a function"),
        ({"AGENT": AGENT, "make_deps": make_deps, "DEV_STUBS": {"a/b": stub}}, "not a setting"),
    ],
)
def test_a_module_that_misses_the_protocol_is_named_and_told_what_to_do(
    names: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"src/agent\.py") as raised:
        AgentModule.load(module(**names))
    assert says in str(raised.value)


def test_optional_names_are_read_when_present() -> None:
    def make_llm(env: Any) -> Any:
        return None

    loaded = AgentModule.load(
        module(
            AGENT=AGENT,
            make_deps=make_deps,
            make_llm=make_llm,
            SETTINGS=["B_URL", "A_URL"],
            DEV_STUBS={"A_URL": stub},
        )
    )
    assert loaded.has_own_llm
    assert loaded.settings == ("B_URL", "A_URL")
    assert dict(loaded.dev_stubs) == {"A_URL": stub}
