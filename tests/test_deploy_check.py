"""scripts/check-deploy and scripts/deploy (runtime/deploy_check.py), on CPython, offline:
the settings a deploy needs are named, each with whether [vars] or a secret gives it a value.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENT = """
from durable_agents import Agent

AGENT = Agent("checked", "Be brief.")
SETTINGS = ("ORDERS_API_URL", "ORDERS_API_KEY")
DEV_STUBS = {"ORDERS_API_URL": lambda method, path, body, headers: (200, {}), "MAIL_URL": print}


def make_deps(env, http):
    return None
"""
CONFIG = """
name = "checked"
main = "entry.py"
compatibility_date = "2026-09-08"

[vars]
LLM_PROVIDER = "{provider}"
ORDERS_API_URL = "https://orders.example/api"
MAIL_URL = ""
"""


@pytest.fixture
def deploy_check(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """runtime/deploy_check.py, with runtime/ importable (it imports its neighbours there)
    and `agent` in sys.modules restored afterwards (the check imports the module it checks)."""
    monkeypatch.syspath_prepend(str(ROOT / "runtime"))
    monkeypatch.delitem(sys.modules, "agent", raising=False)
    file = ROOT / "runtime" / "deploy_check.py"
    spec = importlib.util.spec_from_file_location("deploy_check", file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "deploy_check", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def project(tmp_path: Path, provider: str) -> list[str]:
    (tmp_path / "wrangler.toml").write_text(CONFIG.format(provider=provider))
    (tmp_path / "agent.py").write_text(AGENT)
    return ["--config", str(tmp_path / "wrangler.toml"), "--agent", str(tmp_path / "agent.py")]


def test_offline_it_names_each_needed_setting_without_a_value_and_fails(
    deploy_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = project(tmp_path, "anthropic")
    assert deploy_check.main([*args, "--offline"]) == 1
    out = capsys.readouterr().out
    assert "secrets: not listed (--offline)" in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line[:2] == "  "}
    assert rows == {
        "API_TOKEN": "MISSING",
        "LLM_API_KEY": "MISSING",  # what LLM_PROVIDER=anthropic needs
        "ORDERS_API_URL": "[vars]",
        "ORDERS_API_KEY": "MISSING",
        "MAIL_URL": "MISSING",  # empty in [vars]: no stub answers on Cloudflare
    }
    assert "LLM_PROVIDER=anthropic needs LLM_API_KEY" in out
    assert (
        "check-deploy: no value on Cloudflare for API_TOKEN, LLM_API_KEY, ORDERS_API_KEY, "
        "MAIL_URL: set each with `scripts/wrangler secret put NAME`"
    ) in out


def test_settings_it_is_told_are_secrets_pass(
    deploy_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = project(tmp_path, "anthropic")
    secrets = tmp_path / "prod.json"
    secrets.write_text(json.dumps({"LLM_API_KEY": "sk-ant-x", "MAIL_URL": "https://m"}))
    told = ["--secret", "API_TOKEN", "--secret", "ORDERS_API_KEY", "--secrets-file", str(secrets)]
    assert deploy_check.main([*args, "--offline", *told]) == 0
    out = capsys.readouterr().out
    assert "check-deploy: every setting the Worker needs has a value" in out
    assert "sk-ant-x" not in out  # names only: a secret's value is never read out


def test_the_demo_model_needs_no_key_and_a_dry_run_only_warns(
    deploy_check: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = project(tmp_path, "demo")
    listed: list[Path] = []

    def secret_list(config_file: Path, env_name: str | None) -> tuple[None, str]:
        listed.append(config_file)  # (no wrangler here: it would go online with a token)
        return None, "wrangler secret list failed: not logged in"

    monkeypatch.setattr(deploy_check, "listed_secrets", secret_list)
    # scripts/deploy: wrangler's arguments, among them the check's (--config, --dry-run).
    assert deploy_check.main(["--wrangler-deploy", *args, "--dry-run", "--outdir", "x"]) == 0
    out = capsys.readouterr().out
    assert "LLM_API_KEY" not in out
    assert "deploy: no value on Cloudflare for API_TOKEN, ORDERS_API_KEY, MAIL_URL" in out
    assert "secrets: wrangler secret list failed: not logged in" in out
    assert listed == [tmp_path / "wrangler.toml"]
    assert "deploy: --dry-run: going on (nothing is deployed)" in out


def test_a_model_no_secret_can_fix_is_an_error(
    deploy_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = project(tmp_path, "workers-ai")  # without the [ai] binding
    told = ["--secret", "API_TOKEN", "--secret", "ORDERS_API_KEY", "--secret", "MAIL_URL"]
    assert deploy_check.main([*args, "--offline", *told]) == 1
    out = capsys.readouterr().out
    assert (
        "check-deploy: the model cannot be made from [vars]: LLM_PROVIDER=workers-ai needs the "
        "Workers AI binding AI"
    ) in out
    assert "no value on Cloudflare" not in out
    with (tmp_path / "wrangler.toml").open("a") as config:
        config.write('\n[ai]\nbinding = "AI"\n')
    assert deploy_check.main([*args, "--offline", *told]) == 0


def test_a_setting_a_toolset_reads_is_needed_naming_the_toolset(
    deploy_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tests/agents/mcp_only.py: its only tools are MCPTools(url_setting="MCP_URL"), which
    # refuses every turn without it; a stub in DEV_STUBS would not answer on Cloudflare.
    (tmp_path / "wrangler.toml").write_text(CONFIG.format(provider="demo"))
    agent = ROOT / "tests" / "agents" / "mcp_only.py"
    args = ["--config", str(tmp_path / "wrangler.toml"), "--agent", str(agent), "--offline"]
    assert deploy_check.main([*args, "--secret", "API_TOKEN"]) == 1
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split(maxsplit=2)[1:] for line in out.splitlines() if line[:2] == "  "
    }
    assert rows["MCP_URL"] == [
        "MISSING",
        "read by the toolset MCPTools(url_setting='MCP_URL', name=None): without it every "
        "turn fails",
    ]
    assert "check-deploy: no value on Cloudflare for MCP_URL: set each with " in out
    assert deploy_check.main([*args, "--secret", "API_TOKEN", "--secret", "MCP_URL"]) == 0


def test_wrangler_secret_names_in_a_secrets_file(deploy_check: ModuleType, tmp_path: Path) -> None:
    file = tmp_path / "prod.env"
    file.write_text("# prod\nAPI_TOKEN=abc\nexport LLM_API_KEY='k'\n")
    assert deploy_check.secrets_file_names(file) == {"API_TOKEN", "LLM_API_KEY"}
    file.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        deploy_check.secrets_file_names(file)


def test_every_agent_module_is_checked_and_a_bad_one_refused(
    deploy_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    args = project(tmp_path, "demo")
    agents = tmp_path / "agents"
    agents.mkdir()
    monkeypatch.delitem(sys.modules, "agents.refunds", raising=False)
    refunds = AGENT.replace('"checked"', '"refunds"').replace('"ORDERS_API_KEY"', '"PAYMENTS_KEY"')
    (agents / "refunds.py").write_text(refunds)
    secrets = ["--secret", "API_TOKEN", "--secret", "ORDERS_API_KEY", "--secret", "MAIL_URL"]
    # Its own stub for a setting the other module stubs too: the dev server serves one.
    assert deploy_check.main([*args, "--agents", str(agents), "--offline", *secrets]) == 2
    assert "both have a dev stub for ORDERS_API_URL, and not the same one" in (
        capsys.readouterr().out
    )
    (agents / "refunds.py").write_text(refunds + "DEV_STUBS = {}\n")
    assert deploy_check.main([*args, "--agents", str(agents), "--offline", *secrets]) == 1
    out = capsys.readouterr().out
    assert "agent checked, refunds (" in out
    assert "check-deploy: no value on Cloudflare for PAYMENTS_KEY: set each" in out  # refunds'
    # Two modules of one AGENT.name, a file name that is no agent's: refused (exit 2).
    (agents / "refunds.py").write_text(AGENT)
    (agents / "Bad-Name.py").write_text(AGENT.replace('"checked"', '"bad"'))
    assert deploy_check.main([*args, "--agents", str(agents), "--offline", *secrets]) == 2
    out = capsys.readouterr().out
    assert "define one agent name, 'checked'" in out
    assert "'Bad-Name' is not an agent's name" in out
