"""What the dev server (runtime/dev.py) reads before it starts anything, on CPython: a
Worker's JSONC config as wrangler reads it (runtime/wrangler_config.py: comments and
trailing commas outside strings only), and the settings an agent's toolsets need.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import runtime_module

dev = runtime_module("dev")
wrangler_config = runtime_module("wrangler_config")


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ('{"A": "x, }"}', {"A": "x, }"}),
        ('{"A": ["a, ]", "b,]"]}', {"A": ["a, ]", "b,]"]}),
        ('{"URL": "https://example.com/a//b"}', {"URL": "https://example.com/a//b"}),
        ('{"A": "/* no comment */", "B": "*/"}', {"A": "/* no comment */", "B": "*/"}),
        (r'{"A": "say \"//\", }", "B": 1}', {"A": 'say "//", }', "B": 1}),
        (r'{"A": "C:\\", "B": "\\\"x, ]"}', {"A": "C:\\", "B": '\\"x, ]'}),
        ('{"A": "x"} // a comment, }', {"A": "x"}),
        ('{\n  // a comment "with a quote\n  "A": 1, /* and ", ]" */ "B": 2\n}', {"A": 1, "B": 2}),
        ('{"A": [1, 2, ], "B": {"C": 3, }, }', {"A": [1, 2], "B": {"C": 3}}),
        ('{"A": [1, [2, ], ],\n}', {"A": [1, [2]]}),
        ('{"A": 1, // last\n /* really */ }', {"A": 1}),
        ('[\n  "a", /* a, ] */\n  "b",\n]', ["a", "b"]),
        ('{"A": "\u00fc//\u2713"}', {"A": "\u00fc//\u2713"}),
    ],
)
def test_jsonc_reads_comments_and_trailing_commas_outside_strings_only(
    text: str, read: Any
) -> None:
    assert wrangler_config.jsonc(text) == read


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{\n  "A": 1,,\n}', "property name .*: line 2 column 10"),  # not `,` before `}`
        ("[\n  1,,\n]", "Expecting value: line 2 column 5"),
        ('{\n  "A": 1 /* never closed\n}', r"Unterminated /\* comment: line 2 column 10"),
        ('{\n  "A": "never closed', "Unterminated string starting at: line 2 column 8"),
        ('{\n  "A": "no line break\n in a string"}', "Invalid control character at: line 2"),
        ('{"A": 1} ,', "Extra data: line 1 column 10"),
        ("{'A': 1}", "line 1 column 2"),
    ],
)
def test_bad_jsonc_is_an_error_at_its_line_and_column(text: str, error: str) -> None:
    with pytest.raises(json.JSONDecodeError, match=error):
        wrangler_config.jsonc(text)


def test_a_config_that_is_not_jsonc_stops_the_server_naming_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "wrangler.jsonc"
    config.write_text('{\n  "name": "x",\n  "main": "src/entry.py",,\n}\n')
    with pytest.raises(SystemExit) as exited:
        dev.read_config(config)
    assert exited.value.code == 1
    assert f"dev: cannot read {config}: Expecting property name enclosed in double quotes: " in (
        capsys.readouterr().err
    )
    config.write_text('{\n  "name": "x, }", // named\n  "main": "src/entry.py",\n}\n')
    assert dev.read_config(config) == {"name": "x, }", "main": "src/entry.py"}


TOOLSET_AGENT = """
from durable_agents import Agent
from durable_agents.mcp import MCPTools

AGENT = Agent("crm", "Look customers up.", toolsets=[
    MCPTools(url_setting="CRM_URL", token_setting="CRM_TOKEN", name="crm"),
    MCPTools(url_setting="NOTES_URL", name="notes"),
])
DEV_STUBS = {"NOTES_URL": lambda method, path, body, headers: (200, {})}


def make_deps(env, http):
    return None
"""


def test_a_setting_a_toolset_reads_must_have_a_value_a_dev_stub_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module loads as `agent`: put back whatever the process had under that name
    # (tests/test_agent.py imports the user's src/agent.py as `agent`).
    monkeypatch.setitem(sys.modules, "agent", sys.modules.get("agent"))
    monkeypatch.delitem(sys.modules, "agent")
    (tmp_path / "agent.py").write_text(TOOLSET_AGENT)
    agent = dev.describe_agent(tmp_path / "agent.py")

    def failure(dev_vars: dict[str, str]) -> str | None:
        settings = dev.read_settings({"vars": {"CRM_URL": ""}}, dev_vars, [])
        served = dev.with_defaults(settings, agent, "http://127.0.0.1:8787")
        return dev.toolset_failure(agent, served, Path("wrangler.toml"), Path("x/.dev.vars"))

    # NOTES_URL has its dev stub; the crm toolset has neither of its two.
    assert failure({"CRM_TOKEN": " "}) == (
        "the agent's toolset MCPTools(url_setting='CRM_URL', name='crm') needs CRM_URL and "
        "CRM_TOKEN, which are not set: every turn would fail. Set CRM_URL, CRM_TOKEN in "
        "x/.dev.vars, the environment or [vars] of wrangler.toml. On Cloudflare: [vars], or "
        "a secret (`scripts/wrangler secret put CRM_URL`)"
    )
    assert failure({"CRM_URL": "https://crm.example/mcp"}) == (
        "the agent's toolset MCPTools(url_setting='CRM_URL', name='crm') needs CRM_TOKEN, "
        "which is not set: every turn would fail. Set CRM_TOKEN in x/.dev.vars, the "
        "environment or [vars] of wrangler.toml. On Cloudflare: [vars], or a secret "
        "(`scripts/wrangler secret put CRM_TOKEN`)"
    )
    assert failure({"CRM_URL": "https://crm.example/mcp", "CRM_TOKEN": "t"}) is None
