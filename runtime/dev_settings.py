"""The settings a Worker gets under the dev server, and the banner's lines on them: where
each comes from ([vars], .dev.vars, the environment, this server's defaults, the agent's
dev stubs), the env file handed to `wrangler dev --env-file`, and why a turn would fail
for want of one. The guide: docs/dev-server.md and docs/configuration.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_checks import SECRET_SETTINGS, model_problem, toolset_settings  # runtime/
from wrangler_config import config_bindings

DEV_TOKEN = "dev-token"
# The kit's own settings: read from the environment even when [vars] and .dev.vars omit them.
KIT_SETTINGS = (
    "API_TOKEN", "MAX_BODY_BYTES", "LLM_PROVIDER", "LLM_MODEL", "LLM_BASE_URL", "LLM_API_KEY",
    "CHAT_PAGE", "SESSION_TOKEN_SECRET", "MAX_SESSION_TOKENS", "MAX_CONTEXT_TOKENS",
    "RETENTION_DAYS", "SESSION_STORE", "SELF_RESUME_SECONDS", "WORKERS_PLAN",
)  # fmt: skip

# The npm `dotenv` package's line (wrangler reads .dev.vars and env files with it).
DOTENV_LINE = re.compile(
    r"""^\s*(?:export\s+)?([\w.-]+)(?:\s*=\s*?|:\s+?)(\s*'(?:\\'|[^'])*'|\s*"(?:\\"|[^"])*"|"""
    r"""\s*`(?:\\`|[^`])*`|[^#\r\n]+)?\s*(?:#.*)?$""",
    re.M | re.A,
)


def read_dotenv(file: Path) -> dict[str, str]:
    """.dev.vars as wrangler reads it (dotenv's parse, no $-expansion): KEY=value lines,
    `export`, # comments; a value in single, double or back quotes is literal and may span
    lines (in double quotes the escapes backslash-n and backslash-r are a line feed and a
    carriage return); an unquoted one ends at #."""
    values: dict[str, str] = {}
    if not file.is_file():
        return values
    text = re.sub(r"\r\n?", "\n", file.read_text())
    for match in DOTENV_LINE.finditer(text):
        value = (match.group(2) or "").strip()
        quote = value[:1]
        value = re.sub(r"^(['\"`])([\s\S]*)\1$", r"\2", value, flags=re.M)
        if quote == '"':
            value = value.replace("\\n", "\n").replace("\\r", "\r")
        values[match.group(1)] = value
    return values


def dotenv_line(name: str, value: str) -> str:
    """A line wrangler's dotenv, then its $-expansion, reads back as exactly `value`: in
    quotes the value does not hold (see read_dotenv), each `$` escaped with a backslash
    (dotenv-expand's literal `$`). ValueError for a value no quoting carries."""
    escaped = value.replace("$", "\\$")
    for quote in ("'", "`"):
        if quote not in value and "\r" not in value:  # dotenv reads a CR as a line end
            return f"{name}={quote}{escaped}{quote}\n"
    if '"' not in value and not re.search(r"\\[nr]", value):
        escaped = escaped.replace("\n", "\\n").replace("\r", "\\r")
        return f'{name}="{escaped}"\n'
    raise ValueError(f"{name}: wrangler's dotenv cannot carry this value (it holds ', \" and `)")


def is_empty(value: object) -> bool:
    return not str(value or "").strip()


@dataclass(frozen=True, slots=True)
class Setting:
    """A setting's value and where it comes from: [vars], .dev.vars, environment, default
    (this server's, for the kit) or dev stub (an agent's DEV_STUBS)."""

    value: str
    source: str


def read_settings(
    config: Mapping[str, Any], dev_vars: Mapping[str, str], names: list[str]
) -> dict[str, Setting]:
    """[vars], then .dev.vars, then the environment variables of `names` (later wins)."""
    found = {k: Setting(str(v), "[vars]") for k, v in (config.get("vars") or {}).items()}
    found.update((k, Setting(v, ".dev.vars")) for k, v in dev_vars.items())
    found.update((k, Setting(os.environ[k], "environment")) for k in names if k in os.environ)
    return found


def with_defaults(settings: Mapping[str, Setting], agent: Any, origin: str) -> dict[str, Setting]:
    """The kit's settings with this server's defaults: API_TOKEN "dev-token", CHAT_PAGE
    "on", and an empty setting of DEV_STUBS pointed at `<origin>/__dev/<NAME>`."""
    settings = dict(settings)
    for name, value in (("API_TOKEN", DEV_TOKEN), ("CHAT_PAGE", "on")):
        if is_empty(getattr(settings.get(name), "value", "")):
            settings[name] = Setting(value, "default")
    stubbed = [n for n in agent.dev_stubs if is_empty(getattr(settings.get(n), "value", ""))]
    for name in stubbed:
        settings[name] = Setting(f"{origin}/__dev/{name}", "dev stub")
    if stubbed:
        settings["DEV_STUBS"] = Setting("on", "dev stub")
    return settings


def env_file_settings(settings: Mapping[str, Setting]) -> dict[str, str]:
    """What the env file handed to wrangler holds: every setting not from [vars] (which
    wrangler reads from the config itself)."""
    return {k: s.value for k, s in settings.items() if s.source != "[vars]"}


def settings_notes(settings: Mapping[str, Setting], agent: Any) -> list[str]:
    """The banner's lines on the settings: the agent, its model and session store, then
    each setting of the kit that is set and each of the agent's, with its source. Values
    are shown for the kit's settings that are not secrets, and from [vars]: .dev.vars and
    the environment hold secrets, and which of the agent's settings are is not known."""

    def note(name: str, shown: bool) -> str:
        setting = settings.get(name)
        if setting is None or is_empty(setting.value):
            return f"{name} is not set"
        if setting.source == "dev stub":
            return f"{name} is not set: using the agent's dev stub {setting.value}"
        if name == "API_TOKEN" and setting.source == "default":
            return f'API_TOKEN is not set: using "{DEV_TOKEN}" (set it in .dev.vars)'
        source = "the default" if setting.source == "default" else setting.source
        if shown or setting.source in ("[vars]", "default"):
            return f"{name}={setting.value} ({source})"
        return f"{name} is set ({source})"

    def value(name: str) -> str:
        setting = settings.get(name)
        return "" if setting is None else setting.value.strip()

    provider = value("LLM_PROVIDER") or ("(unset)" if value("LLM_API_KEY") else "demo")
    at = f" at {value('LLM_BASE_URL')}" if provider != "demo" and value("LLM_BASE_URL") else ""
    own = " (the agent's make_llm decides)" if agent.has_own_llm else ""
    store = settings.get("SESSION_STORE")
    if store is None or is_empty(store.value):
        where = "d1 (SESSION_STORE is not set: the default)"
    else:
        where = f"{store.value.strip()} (SESSION_STORE from {store.source})"
    notes = [f"agent {agent.agent.name}; model: {provider}{at}{own}; session store: {where}"]
    kit = [n for n in KIT_SETTINGS if n not in ("SESSION_STORE", "WORKERS_PLAN")]
    notes += [note(n, n not in SECRET_SETTINGS) for n in kit if value(n)]
    notes += [note(n, False) for n in dict.fromkeys([*agent.settings, *agent.dev_stubs])]
    return notes


def model_failure(
    agent: Any, settings: Mapping[str, Setting], config: Mapping[str, Any], dev_vars_file: Path
) -> str | None:
    """Why every turn would fail for want of a model (the agent's make_llm, or llm_from_env,
    raises the kit's ConfigurationError with these settings), said for this server's user."""
    values = {k: s.value for k, s in settings.items()}
    problem = model_problem(agent.make_llm, values, config_bindings(config))
    if problem is None:
        return None
    provider = settings.get("LLM_PROVIDER")
    came = (
        "LLM_PROVIDER is not set"
        if provider is None or is_empty(provider.value)
        else f"LLM_PROVIDER={provider.value.strip()} is from {provider.source}"
    )
    if problem.missing is None:
        return f"the agent's model cannot be made: {problem.message} ({came})"
    return (
        f"{problem.message} ({came}): set {problem.missing} in {dev_vars_file} or the "
        f"environment, or use the offline model (LLM_PROVIDER=demo). On Cloudflare it is a "
        f"secret: `scripts/wrangler secret put {problem.missing}`"
    )


def toolset_failure(
    agent: Any, settings: Mapping[str, Setting], config_file: Path, dev_vars_file: Path
) -> str | None:
    """Why every turn would fail for want of a setting one of the agent's toolsets reads
    (MCPTools refuses a turn while its url_setting or token_setting is missing or empty),
    said for this server's user; a setting of DEV_STUBS has a value (its stub's URL)."""
    missing: dict[str, list[str]] = {}
    for name, toolset in toolset_settings(agent).items():
        if is_empty(getattr(settings.get(name), "value", "")):
            missing.setdefault(toolset, []).append(name)
    if not missing:
        return None
    names = [name for group in missing.values() for name in group]
    needs = "; ".join(
        f"the agent's toolset {toolset} needs {' and '.join(group)}, which "
        f"{'is' if len(group) == 1 else 'are'} not set"
        for toolset, group in missing.items()
    )
    return (
        f"{needs}: every turn would fail. Set {', '.join(names)} in {dev_vars_file}, the "
        f"environment or [vars] of {config_file.name}. On Cloudflare: [vars], or a secret "
        f"(`scripts/wrangler secret put {names[0]}`)"
    )
