"""Before a deploy: does every setting the Worker needs have a value on Cloudflare?

    scripts/check-deploy [--config wrangler.toml] [--env NAME] [--agent src/agent.py]
                         [--agents src/agents] [--secret NAME ...] [--secrets-file FILE]
                         [--offline]
    scripts/deploy [wrangler deploy arguments]   # this check, then `wrangler deploy`

Needed: API_TOKEN (without it the Worker refuses every request), what the configured model
needs (the agent's `make_llm`, or `llm_from_env`, is called here on CPython with the
config's [vars]: LLM_API_KEY for LLM_PROVIDER=anthropic, ...), and the agent module's
SETTINGS (with those its toolsets read: `MCPTools(url_setting="MCP_URL")` refuses every
turn without a value, and is named beside them) and DEV_STUBS (no stub answers on
Cloudflare), of every agent module the Worker serves (src/agent.py and src/agents/*.py: an
agent module that does not load, a file name that is no agent's name and two modules of
one AGENT.name are refused, exit status 2). A setting has a value when [vars] gives it a
non-empty one or it is one of the Worker's secrets.

Which secrets the Worker has cannot be known offline. Counted as secrets:
- what `wrangler secret list` says (online and logged in, as a deploy is anyway; skipped
  with --offline; a Worker not deployed yet has none);
- the names given with --secret, those of --secrets-file FILE (the file `wrangler deploy
  --secrets-file` uploads with the deploy: KEY=value lines or a JSON object), and those of
  the config's `[secrets] required` (wrangler refuses to deploy while one is not set).
.dev.vars is never read: it holds the local values.

Exit status 0 when every needed setting has a value, 1 (naming each missing one and how
to set it) when one has none, 2 for a usage error. scripts/deploy stops on 1, except for
`--dry-run`, which deploys nothing: there the check only warns.

What it shares with the dev server (runtime/dev.py) lives beside both: the agent module
on CPython and what it needs (runtime/agent_checks.py), the config as wrangler reads it
(runtime/wrangler_config.py). The guide: docs/deploy.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_checks import (  # runtime/, beside this file
    MODEL_KEYS,
    SECRET_SETTINGS,
    ServedModules,
    agent_files,
    load_served,
    model_problem,
    shown_path,
    toolset_settings,
)
from wrangler_config import ConfigError, config_bindings, load_config, project_config

PROJECT = Path(__file__).resolve().parent.parent
WRANGLER = PROJECT / "scripts" / "wrangler"
# -- the check -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Needed:
    name: str
    why: str


def needed_settings(
    agent: Any, vars_: Mapping[str, str], bindings: Sequence[str]
) -> tuple[list[Needed], str | None]:
    """The settings the Worker needs (whatever their values), and why the model cannot be
    made from [vars] whatever the secrets (an unknown LLM_PROVIDER, say), or None."""
    needed = [Needed("API_TOKEN", "the API's bearer token: without it every request is refused")]
    plain = {k: v for k, v in vars_.items() if str(v).strip()}
    problem = model_problem(agent.make_llm, plain, bindings)
    if problem is not None and problem.missing is None:
        return needed, problem.message
    if problem is not None and problem.missing is not None:
        needed.append(Needed(problem.missing, problem.message))
    else:
        for name in MODEL_KEYS:  # set: still needed if the model fails without it
            if name in plain:
                without = {k: v for k, v in plain.items() if k != name}
                lacking = model_problem(agent.make_llm, without, bindings)
                if lacking is not None and lacking.missing == name:
                    needed.append(Needed(name, lacking.message))
    toolsets = toolset_settings(agent)
    needed += [
        Needed(name, f"read by the toolset {toolsets[name]}: without it every turn fails")
        if name in toolsets
        else Needed(name, "the agent's SETTINGS")
        for name in agent.settings
    ]
    needed += [
        Needed(name, "the agent's DEV_STUBS (no stub answers on Cloudflare)")
        for name in agent.dev_stubs
        if name not in agent.settings
    ]
    return needed, None


def needed_by_all(
    agent: Any, vars_: Mapping[str, str], bindings: Sequence[str]
) -> tuple[list[Needed], str | None]:
    """`needed_settings` of each agent module (`agent`: one, or all the Worker serves), each
    setting once; the first reason a model cannot be made, if one cannot."""
    modules = list(agent.modules.values()) if isinstance(agent, ServedModules) else [agent]
    needed: list[Needed] = []
    broken = None
    for module in modules:
        more, why = needed_settings(module, vars_, bindings)
        needed += [n for n in more if n.name not in {m.name for m in needed}]
        broken = broken or why
    return needed, broken


def listed_secrets(config_file: Path, env_name: str | None) -> tuple[set[str] | None, str]:
    """The Worker's secrets by `wrangler secret list`, or None and why not."""
    args = [str(WRANGLER), "secret", "list", "--format", "json", "--config", str(config_file)]
    args += ["--env", env_name] if env_name else []
    environment = {**os.environ, "CI": "true", "NO_COLOR": "1", "WRANGLER_SEND_METRICS": "false"}
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=60, env=environment,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"wrangler secret list did not answer: {exc}"
    output = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    if done.returncode == 0:
        try:
            return {str(item["name"]) for item in json.loads(done.stdout)}, "wrangler secret list"
        except (ValueError, TypeError, KeyError):
            return None, "wrangler secret list printed no JSON list"
    # Cloudflare's "script not found": a first deploy (not checked offline: the code is
    # the one Cloudflare's API documents for it).
    if "[code: 10007]" in output:
        return set(), "wrangler secret list: the Worker is not deployed yet, it has no secrets"
    reason = next((line.strip() for line in output.splitlines() if "ERROR" in line), "")
    return None, f"wrangler secret list failed: {reason or output.strip()[-300:]}"


def secrets_file_names(file: Path) -> set[str]:
    """The names in a `wrangler deploy --secrets-file` file: a JSON object or KEY=value."""
    text = file.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        return {m.group(1) for m in re.finditer(r"(?m)^\s*(?:export\s+)?(\w+)\s*=", text)}
    if not isinstance(data, dict):
        raise ValueError(f"{file}: not a JSON object of secrets")
    return {str(name) for name in data}


def check(
    config: Mapping[str, Any],
    agent: Any,
    secrets: set[str],
    env_name: str | None = None,
) -> tuple[list[str], list[str], str | None]:
    """For a config, its agent and the Worker's known secrets: the report's lines, the
    needed settings without a value, and why the model cannot be made whatever the
    secrets (an unknown LLM_PROVIDER, say), or None."""
    section = config if env_name is None else (config.get("env") or {}).get(env_name) or {}
    vars_ = {k: str(v) for k, v in (section.get("vars") or {}).items()}
    declared = (section.get("secrets") or {}).get("required") or []
    secrets = secrets | {str(name) for name in declared}
    needed, broken = needed_by_all(agent, vars_, config_bindings(section or config))
    lines, missing = [], []
    width = max(len(n.name) for n in needed)
    for item in needed:
        if str(vars_.get(item.name) or "").strip():
            where = "[vars]"
            if item.name in SECRET_SETTINGS:
                where += " (a secret in plain text: better `wrangler secret put`)"
        elif item.name in secrets:
            where = "secret"
        else:
            where = "MISSING"
            missing.append(item.name)
        lines.append(f"  {item.name:<{width}}  {where:<8}  {item.why}")
    return lines, missing, broken


def parse_options(argv: list[str] | None) -> tuple[argparse.Namespace, bool]:
    """The check's options, and whether scripts/deploy runs it (`--wrangler-deploy` first:
    then the arguments are wrangler deploy's, the check's among them)."""
    parser = argparse.ArgumentParser(
        prog="scripts/check-deploy", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("--config", "-c", type=Path)
    parser.add_argument("--env", "-e", dest="env_name")
    parser.add_argument("--agent", type=Path, help="the agent module (default: src/agent.py)")
    parser.add_argument("--agents", type=Path, help="the other agents (default: src/agents/)")
    parser.add_argument("--secret", action="append", default=[], metavar="NAME",
                        help="a setting that is a secret of the Worker already")  # fmt: skip
    parser.add_argument("--secrets-file", type=Path)
    parser.add_argument("--offline", action="store_true", help="no `wrangler secret list`")
    parser.add_argument("--dry-run", action="store_true", help="only warn (scripts/deploy)")
    deploying = argv is not None and argv[:1] == ["--wrangler-deploy"]
    if deploying:
        options, _ = parser.parse_known_args((argv or [])[1:])
    else:
        options = parser.parse_args(argv)
    return options, deploying


def read_config(config: Path | None) -> tuple[Path, dict[str, Any]]:
    """The config file (--config, else the project's) and what it holds. One that cannot be
    read exits 1 with the dev server's words for it (scripts/dev reads configs the same way)."""
    try:
        config_file = (config or project_config(PROJECT)).resolve()
        return config_file, load_config(config_file)
    except ConfigError as exc:
        print(f"dev: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


def known_secrets(options: argparse.Namespace, config_file: Path) -> tuple[set[str], str]:
    """The secrets counted as set (--secret, --secrets-file, `wrangler secret list` unless
    --offline) and where the listed ones come from; ValueError or OSError for a
    --secrets-file that cannot be read."""
    secrets = set(options.secret)
    if options.secrets_file is not None:
        secrets |= secrets_file_names(options.secrets_file)
    if options.offline:
        return secrets, "not listed (--offline)"
    listed, source = listed_secrets(config_file, options.env_name)
    return secrets | (listed or set()), source


def load_agents(options: argparse.Namespace, say: Callable[[str], None]) -> ServedModules | None:
    """Every agent module the Worker serves (--agent, else src/agent.py; those of --agents,
    else src/agents/), loaded; None, each reason said, if one does not load (the file, the
    line, what failed and the fix), none is there, or two modules' DEV_STUBS differ."""
    agent_file = (options.agent or PROJECT / "src" / "agent.py").resolve()
    agents_dir = (options.agents or PROJECT / "src" / "agents").resolve()
    files = agent_files(agent_file, agents_dir)
    if not files:
        say(f"no agent module: neither {shown_path(agent_file)} nor {shown_path(agents_dir)}/*.py")
        return None
    served = load_served(files)
    for failure in served.failures.values():
        say(failure)
    try:
        served.dev_stubs  # noqa: B018 - two modules' stubs of one setting that differ raise
    except Exception as exc:
        say(str(exc))
        return None
    return None if served.failures else served


def main(argv: list[str] | None = None) -> int:
    options, deploying = parse_options(argv)
    prog = "deploy" if deploying else "check-deploy"

    def say(message: str) -> None:
        print(f"{prog}: {message}", flush=True)

    config_file, config = read_config(options.config)
    agent = load_agents(options, say)
    if agent is None:
        return 2
    try:
        secrets, source = known_secrets(options, config_file)
    except (OSError, ValueError) as exc:
        say(f"--secrets-file: {exc}")
        return 2
    lines, missing, broken = check(config, agent, secrets, options.env_name)
    where = config_file.relative_to(PROJECT) if config_file.is_relative_to(PROJECT) else config_file
    files = ", ".join(shown_path(f) for f in agent.files.values())
    say(f"{where}{f' [env.{options.env_name}]' if options.env_name else ''}, agent "
        f"{agent.agent.name} ({files}); secrets: {source}")  # fmt: skip
    for line in lines:
        print(line)
    if broken is not None:
        say(f"the model cannot be made from [vars]: {broken}")
    if missing:
        put = "scripts/wrangler secret put NAME"
        put += f" --env {options.env_name}" if options.env_name else ""
        say(
            f"no value on Cloudflare for {', '.join(missing)}: set each with `{put}` (a value "
            "that is not secret may go in [vars] instead), or pass --secret NAME for one that "
            "is set already"
        )
    if not (missing or broken):
        say("every setting the Worker needs has a value")
        return 0
    if options.dry_run:
        say("--dry-run: going on (nothing is deployed)")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
