"""The dev server: a Python Worker served by `wrangler dev` on real workerd, offline.

    scripts/dev [--port 8787] [--ip 127.0.0.1] [--persist-to DIR] [--config FILE]
                [--dev-vars FILE] [--agent FILE] [--migrate-only]

    --config FILE    any Python Worker's wrangler.toml, .json or .jsonc (default: this
                     repo's wrangler.toml); --persist-to and .dev.vars default to its folder
    --agent FILE     serve this agent module instead of src/agent.py (this kit's Worker only)
    --port 0         any free port (the `ready on` line says which)
    --migrate-only   apply the config's D1 migrations to the local state and exit

What it adds to `wrangler dev` (wrangler reads the config, builds, bundles and runs workerd;
nothing of the Worker's runtime is ours):
- Offline Pyodide. workerd fetches Cloudflare's Pyodide bundle at start. Where that host
  cannot be reached (or PYODIDE_BUNDLE=development), workerd runs with its testing flag
  `python_workers_development` and the same Pyodide assembled from npm
  (scripts/pyodide_bundle.py); runtime/workerd gives it the bundle's folder and
  workerd's baseline snapshot of it. The banner says which bundle runs.
- Settings. For this kit's Worker: [vars], then .dev.vars (read as wrangler reads it), then
  environment variables of the kit's settings and the agent module's SETTINGS and
  DEV_STUBS (later wins), handed to wrangler as one env file, wrangler.toml untouched;
  API_TOKEN defaults to "dev-token", CHAT_PAGE to "on"; an empty setting of DEV_STUBS
  points at `<this server>/__dev/<NAME>`, served by the Worker's stub. The banner names
  the session store and each setting with its source ([vars], .dev.vars, environment,
  the default, dev stub); values only where they are not secrets: from [vars] and
  defaults, and of the kit's settings other than API_TOKEN, LLM_API_KEY and
  SESSION_TOKEN_SECRET.
- Fail fast: the agent's model is made once at start, on CPython, from these settings (its
  make_llm, or llm_from_env): a setting it needs and lacks (LLM_API_KEY for
  LLM_PROVIDER=anthropic, ...) stops the server, saying where to set it. So does a setting
  one of its toolsets reads (`MCPTools(url_setting="MCP_URL")`: each of the toolset's
  `settings`) left empty, unless DEV_STUBS has a stub for it.
- Reload. For this kit's Worker this server stages the Worker itself (build_worker.py, in
  its process, into its staging folder) and restages it when a file under src/, the
  --agent file (wherever it is) or the config changes: wrangler, given a copy of the
  config without [build], reloads workerd on the staged change (~3 s from the edit to a
  request served by the new code, nearly all of it workerd starting Python and importing
  the Worker). State under --persist-to (D1, Durable Objects) stays. Another Python
  Worker: its main module's folder is followed the same way.
- D1 migrations: before `wrangler dev` starts (it serves requests as soon as it listens),
  `wrangler d1 migrations apply --local` for each database with a migrations folder whose
  local SQLite file (read read-only) does not record every migration in wrangler's
  d1_migrations table; a start on an up-to-date database runs no wrangler command for it.
- Cron: GET /cdn-cgi/handler/scheduled?cron=... runs the Worker's scheduled() (as
  `wrangler dev --test-scheduled`).
- Limits: WORKERS_PLAN = free (the default) | paid, read like the settings: Cloudflare's
  per-invocation limits of that plan (50 subrequests on free, 10,000 on paid; D1 queries,
  other Cloudflare services), enforced in the Worker with Cloudflare's errors
  (runtime/dev_limits.py); the banner says which.
- A killed server leaves nothing running: wrangler and workerd die with it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import functools
import hashlib
import hmac
import importlib.util
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import dev_limits  # runtime/, beside this file
from deploy_check import (
    SECRET_SETTINGS,
    config_bindings,
    load_agent,
    model_problem,
    toolset_settings,
)

PROJECT = Path(__file__).resolve().parent.parent
# The project's wrangler on its Node, with runtime/workerd as its workerd.
WRANGLER = PROJECT / "scripts" / "wrangler"
DEV_TOKEN = "dev-token"
BUNDLE_HOST = "pyodide-capnp-bin.edgeworker.net"
# workerd's testing flag for a locally assembled Pyodide (314.0.6), and the flags that stop
# the date from selecting the official bundles (python_workers_314 reads False with it).
DEVELOPMENT_FLAGS = (
    "python_workers_development",
    "no_python_workers_20250116",
    "no_python_workers_314",
)
# The earliest compatibility date the development bundle starts with: before it, workerd
# stops at start ("addEventListener(): useCapture must be false"; measured, workerd
# 1.20261117.1). Cloudflare gives such a date an older Pyodide, which offline is not had.
DEVELOPMENT_EARLIEST_DATE = "2026-08-04"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# workerd's baseline snapshot of that Pyodide (scripts/pyodide_bundle.py), loaded at start.
SNAPSHOT = PROJECT / ".cache" / "pyodide-bundle" / "baseline.bin"
# The kit's own settings: read from the environment even when [vars] and .dev.vars omit them.
KIT_SETTINGS = (
    "API_TOKEN", "MAX_BODY_BYTES", "LLM_PROVIDER", "LLM_MODEL", "LLM_BASE_URL", "LLM_API_KEY",
    "CHAT_PAGE", "SESSION_TOKEN_SECRET", "MAX_SESSION_TOKENS", "MAX_CONTEXT_TOKENS",
    "RETENTION_DAYS", "SESSION_STORE", "SELF_RESUME_SECONDS", "WORKERS_PLAN",
)  # fmt: skip
# wrangler's output that says nothing to a user of this server (it runs offline on purpose).
NOISE = re.compile(
    "|".join(
        [
            r"Request\.cf", "ENOTFOUND", "GetAddrInfoReqWrap", r"^\s+at ", "^[│├└┌─┬┼┴┐┘┤]",
            "Attaching additional modules", "telemetry", "Cloudflare collects", "⛅️", "^─+$",
            "Scheduled Workers are not automatically", "To manually trigger", 'curl "http',
            "For more details, see", "Your Worker has access", r"^Binding\s+Resource", r"^env\.",
            "Using secrets", "Starting local server", "Ready on", "custom build",
            "No bindings found", r"^\s*$", r"Press \[", "update available",
        ]
    )
)  # fmt: skip


def fail(message: str) -> NoReturn:
    print(f"dev: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def say(message: str) -> None:
    print(f"dev: {message}", flush=True)


# -- the config ----------------------------------------------------------------------------


def jsonc(text: str) -> Any:
    """JSON with comments (`//` to the line's end, `/* */`) and trailing commas (before `}`
    or `]`), as wrangler reads wrangler.json and wrangler.jsonc: outside strings only (a
    string's `//`, `/*` and `, }` are its text; a backslash escapes its next character).
    Comments and trailing commas become spaces, so an error's line and column
    (json.JSONDecodeError, a ValueError) are those of `text`."""
    out = list(text)
    i, n = 0, len(text)
    comma = -1  # a comma outside strings with no value after it yet

    def blank(start: int, stop: int) -> None:
        out[start:stop] = [c if c in "\r\n" else " " for c in text[start:stop]]

    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            comma = -1
        elif text.startswith("//", i):
            stop = text.find("\n", i)
            stop = n if stop < 0 else stop
            blank(i, stop)
            i = stop - 1
        elif text.startswith("/*", i):
            stop = text.find("*/", i + 2)
            if stop < 0:
                raise json.JSONDecodeError("Unterminated /* comment", text, i)
            blank(i, stop + 2)
            i = stop + 1
        elif c in "}]" and comma >= 0:
            out[comma] = " "
            comma = -1
        elif c == ",":
            comma = i if comma < 0 else -1  # `,,` is no trailing comma: JSON's error
        elif not c.isspace():
            comma = -1
        i += 1
    return json.loads("".join(out))


def read_config(file: Path) -> dict[str, Any]:
    """What this server needs of a Worker's config: wrangler reads the rest itself."""
    try:
        text = file.read_text()
        config = tomllib.loads(text) if file.suffix == ".toml" else jsonc(text)
    except (OSError, ValueError) as exc:
        fail(f"cannot read {file}: {exc}")
    if not isinstance(config, dict) or not isinstance(config.get("main"), str):
        fail(f"{file}: no `main` (the Worker's entry module)")
    return config


def find_config() -> Path:
    for name in ("wrangler.json", "wrangler.jsonc", "wrangler.toml"):
        if (PROJECT / name).is_file():
            return PROJECT / name
    fail(f"no wrangler.json, wrangler.jsonc or wrangler.toml in {PROJECT}; pass --config")


# -- settings ------------------------------------------------------------------------------


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


def describe_agent(agent_file: Path) -> Any:
    """The agent module, imported on CPython (the kit is the same there) and checked as the
    Worker checks it (`AgentModule`); a module that does not load stops the server."""
    try:
        return load_agent(agent_file, PROJECT / "src")
    except Exception as exc:
        import traceback

        traceback.print_exc()
        fail(f"the agent module {agent_file} does not load: {exc}")


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


# -- processes -----------------------------------------------------------------------------


def free_port(ip: str, avoid: int = 0) -> int:
    """A port free on `ip` now (not `avoid`)."""
    while True:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            s.bind((ip, 0))
            port = int(s.getsockname()[1])
        if port != avoid:
            return port


def bundle_choice() -> str:
    """'official' where workerd can fetch Cloudflare's bundle, else 'development'."""
    choice = os.environ.get("PYODIDE_BUNDLE", "auto")
    if choice in ("official", "development"):
        return choice
    if choice != "auto":
        fail(f"PYODIDE_BUNDLE must be auto, official or development, not {choice!r}")
    found: list[bool] = []
    probe = threading.Thread(target=lambda: found.append(_resolves(BUNDLE_HOST)), daemon=True)
    probe.start()
    probe.join(2)
    return "official" if found == [True] else "development"


def _resolves(host: str) -> bool:
    try:
        return bool(socket.getaddrinfo(host, 443))
    except OSError:
        return False


def node_env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0", **extra}


def wrangler(
    args: list[str], env: dict[str, str], cwd: Path = PROJECT, **kwargs: Any
) -> subprocess.Popen[str]:
    """scripts/wrangler; it dies with this process (setpriv's parent-death signal, which
    outlives the script's exec of node)."""
    command = [str(WRANGLER), *args]
    if Path("/usr/bin/setpriv").exists():
        command = ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", *command]
    return subprocess.Popen(command, cwd=cwd, env=env, text=True, **kwargs)


def start_lock(config_file: Path) -> Any:
    """An exclusive lock on starting a server of `config_file` (released by closing it,
    or when this process dies)."""
    locks = PROJECT / ".cache" / "dev-start"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(config_file).encode()).hexdigest()[:16]
    lock = (locks / f"{key}.lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


# Where miniflare keeps a local D1 database, and wrangler's default record of its migrations.
D1_OBJECTS = "miniflare-D1DatabaseObject"
MIGRATIONS_TABLE = "d1_migrations"


def local_object_id(unique_key: str, name: str) -> str:
    """`idFromName(name)` of a Durable Object namespace that `wrangler dev` serves, as
    workerd's local actor-id factory derives it: the key is the SHA-256 of the namespace's
    unique key (`<worker>-<class>` for a Worker's own class, `miniflare-D1DatabaseObject`
    for local D1); 16 bytes of HMAC-SHA256(key, name), then 16 of HMAC-SHA256(key, those),
    as hex."""
    key = hashlib.sha256(unique_key.encode()).digest()
    first = hmac.new(key, name.encode(), "sha256").digest()[:16]
    return (first + hmac.new(key, first, "sha256").digest()[:16]).hex()


def d1_file(persist: Path, database: Mapping[str, Any]) -> Path:
    """The SQLite file of a local D1 database under `persist`, as wrangler and miniflare name
    it: the database is the Durable Object of namespace miniflare-D1DatabaseObject named
    by its `preview_database_id`, else its `database_id`, else its binding, in
    `<persist>/v3/d1/miniflare-D1DatabaseObject/<that object's id>.sqlite`."""
    ids = [database.get(k) for k in ("preview_database_id", "database_id")]
    name = next((i for i in ids if isinstance(i, str)), str(database.get("binding")))
    object_id = local_object_id(D1_OBJECTS, name)
    return persist / "v3" / "d1" / D1_OBJECTS / f"{object_id}.sqlite"


def migrations_folder(config_file: Path, database: Mapping[str, Any]) -> Path:
    return config_file.parent / str(database.get("migrations_dir") or "migrations")


def pending_migrations(
    config_file: Path, config: Mapping[str, Any], persist: Path
) -> list[Mapping[str, Any]]:
    """The D1 databases of `config` with a migrations folder whose local database under
    `persist` may lack one of its migrations. Up to date is only what can be read for sure:
    the database's SQLite file (opened read-only) records every `*.sql` file of the folder in
    wrangler's migrations table; anything else (no file yet, no table, a
    `migrations_pattern`, a file SQLite cannot read) is pending, for wrangler to decide."""
    pending = []
    for database in config.get("d1_databases") or []:
        folder = migrations_folder(config_file, database)
        if folder.is_dir() and not _up_to_date(database, folder, persist):
            pending.append(database)
    return pending


def _up_to_date(database: Mapping[str, Any], folder: Path, persist: Path) -> bool:
    if database.get("migrations_pattern") is not None:
        return False  # wrangler's own glob: not read here
    names = {
        p.name for p in folder.iterdir()
        if p.name.endswith(".sql") and not p.name.startswith(".") and p.is_file()
    }  # fmt: skip
    file = d1_file(persist, database)
    if not file.is_file():
        return not names
    table = str(database.get("migrations_table") or MIGRATIONS_TABLE).replace('"', '""')
    try:
        connection = sqlite3.connect(f"{file.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            applied = {row[0] for row in connection.execute(f'SELECT name FROM "{table}"')}
        finally:
            connection.close()
    except sqlite3.Error:
        return False
    return names <= applied


def apply_migrations(
    config_file: Path, databases: Sequence[Mapping[str, Any]], persist: Path, env: dict[str, str]
) -> list[str]:
    """`wrangler d1 migrations apply --local` for each of `databases` (see
    pending_migrations): wrangler's own command, so its migrations table stays the record.
    The migrations it applied; RuntimeError with its output if it fails."""
    applied: list[str] = []
    for database in databases:
        name = str(database.get("database_name") or database["binding"])
        args = ["d1", "migrations", "apply", name, "--local", "--persist-to", str(persist),
                "--config", str(config_file)]  # fmt: skip
        child = wrangler(
            args, {**env, "CI": "true"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        output, _ = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(
                f"wrangler {' '.join(args)} failed (exit {child.returncode}):\n{output}"
            )
        applied += dict.fromkeys(re.findall(r"│\s*(\S+\.sql)\s*│\s*✅", output))
    return applied


def serve_kit(
    stage: dev_limits.Stage, config_file: Path, agent_file: Path, agent: Any, secrets: list[str]
) -> Path:
    """Stage this kit's Worker (scripts/build_worker.py, in this process, with `agent_file`
    as its agent) and keep it staged: an edit under src/ or of the agent file (wherever it
    is) reloads the Worker within ~3 s. wrangler gets a copy of the config without [build]
    (written beside the staged Worker; returned): it serves the staged folder and reloads
    when a file there changes, instead of rebuilding on changes under src/ only. An edit
    of the config rewrites the copy, which wrangler follows as it follows a config.

    An edit that breaks the build (a syntax error) or the agent module (checked on CPython
    as at start) leaves the running Worker as it is, and says why. `secrets`: the names the
    env file gives (see dev_config)."""
    spec = importlib.util.spec_from_file_location(
        "build_worker", PROJECT / "scripts" / "build_worker.py"
    )
    assert spec is not None
    assert spec.loader is not None
    build_worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_worker)
    os.environ["DURABLE_AGENTS_AGENT"] = str(agent_file)  # build_worker's agent_override
    # build_worker parses every module it stages (~0.2 s); restaging on each edit, only
    # the modules that changed need parsing again.
    imported_names = build_worker.imported_names

    @functools.cache
    def parsed(name: str, path: Path, stamp: tuple[int, int]) -> frozenset[str]:
        return frozenset(imported_names(name, path))

    build_worker.imported_names = lambda name, path: parsed(name, path, _stamp(path))
    copy = stage.dir / "wrangler.json"
    names = (agent.settings, tuple(agent.dev_stubs))

    def rebuild() -> None:
        build_worker.stage(stage.source)
        edited = load_agent(agent_file, PROJECT / "src")
        if (edited.settings, tuple(edited.dev_stubs)) != names:
            say("the agent's SETTINGS or DEV_STUBS changed: they are passed from the next start")
        copied = dev_config(read_config(config_file), config_file, stage.main, secrets)
        text = json.dumps(copied, indent=2, default=str)
        if not copy.is_file() or copy.read_text() != text:
            if copy.is_file():
                say(f"{config_file.name} changed: the Worker reloads with it")
            copy.write_text(text)

    try:
        rebuild()
    except (Exception, SystemExit) as exc:
        fail(f"cannot stage the Worker: {exc}")
    stage.sync()
    stage.follow([PROJECT / "src", agent_file, config_file], rebuild, say)
    return copy


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


# Config fields that name a path, relative to the config's folder (wrangler's reading).
CONFIG_PATHS = ("base_dir", "tsconfig", "pages_build_output_dir")
CONFIG_PATH_MAPS = ("wasm_modules", "text_blobs", "data_blobs")


def dev_config(
    config: dict[str, Any], config_file: Path, main: Path, secrets: Sequence[str] = ()
) -> dict[str, Any]:
    """`config` for a copy outside its folder: `main` the staged main, no [build] (this
    server stages the Worker) nor environments (it serves the top level), paths absolute.
    A config with `[secrets] required` gets those of `secrets` that [vars] lacks added to
    that list: wrangler dev passes only [vars] and those names from the env file, and the
    agent's SETTINGS would not reach the Worker."""
    here = config_file.parent

    def absolute(path: object) -> object:
        return str(here / path) if isinstance(path, str) else path

    copy = {k: v for k, v in config.items() if k not in ("build", "env")}
    copy["main"] = str(main)
    if isinstance(copy.get("secrets"), dict):
        required = [str(name) for name in copy["secrets"].get("required") or []]
        given = [name for name in secrets if name not in (copy.get("vars") or {})]
        required = list(dict.fromkeys([*required, *given]))  # a [vars] name may be neither
        copy["secrets"] = {**copy["secrets"], "required": required}
    for key in CONFIG_PATHS:
        if key in copy:
            copy[key] = absolute(copy[key])
    for key in CONFIG_PATH_MAPS:
        if isinstance(copy.get(key), dict):
            copy[key] = {name: absolute(path) for name, path in copy[key].items()}
    for key, field in (("assets", "directory"), ("site", "bucket")):
        if isinstance(copy.get(key), dict) and field in copy[key]:
            copy[key] = {**copy[key], field: absolute(copy[key][field])}
    if "d1_databases" in copy:
        copy["d1_databases"] = [
            {**db, "migrations_dir": absolute(db.get("migrations_dir") or "migrations")}
            for db in copy["d1_databases"]
        ]
    return copy


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    sys.dont_write_bytecode = True  # no __pycache__ in src/: wrangler reloads on any change there
    parser = argparse.ArgumentParser(prog="scripts/dev", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--ip", default="127.0.0.1")
    parser.add_argument("--persist-to", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--dev-vars", type=Path)
    parser.add_argument("--agent", type=Path)
    parser.add_argument("--migrate-only", action="store_true")
    options = parser.parse_args(argv)
    if not 0 <= options.port <= 65535:
        fail("--port must be 0-65535")
    config_file = (options.config or find_config()).resolve()
    config = read_config(config_file)
    persist = (options.persist_to or config_file.parent / ".wrangler" / "state").resolve()
    if options.migrate_only:
        persist.mkdir(parents=True, exist_ok=True)
        try:
            pending = pending_migrations(config_file, config, persist)
            applied = apply_migrations(config_file, pending, persist, node_env({}))
        except (RuntimeError, OSError) as exc:
            fail(f"D1 migrations: {exc}")
        say(f"state in {persist}; D1 migrations: {', '.join(applied) or 'up to date'}")
        return 0
    dev_vars = read_dotenv((options.dev_vars or config_file.parent / ".dev.vars").resolve())
    main_module = (config_file.parent / config["main"]).resolve()
    is_kit = config_file.parent == PROJECT and main_module.parent == PROJECT / "build" / "worker"
    agent_file = (options.agent or PROJECT / "src" / "agent.py").resolve() if is_kit else None
    if options.agent is not None and not is_kit:
        fail("--agent: only this kit's Worker serves an agent module")
    if agent_file is not None and (agent_file.suffix != ".py" or not agent_file.is_file()):
        fail(f"--agent: no Python file at {agent_file}")

    host = f"[{options.ip}]" if ":" in options.ip else options.ip
    agent = describe_agent(agent_file) if agent_file is not None else None
    names = [*KIT_SETTINGS, *(agent.settings + tuple(agent.dev_stubs) if agent else ())]
    settings = read_settings(config, dev_vars, names)
    if agent is not None:
        dev_vars_file = options.dev_vars or config_file.parent / ".dev.vars"
        placeholder = with_defaults(settings, agent, f"http://{host}:{options.port}")
        failure = model_failure(agent, placeholder, config, dev_vars_file) or toolset_failure(
            agent, placeholder, config_file, dev_vars_file
        )
        if failure:
            fail(failure)
    bundle = bundle_choice()
    date = str(config.get("compatibility_date") or "")
    if bundle == "development" and date < DEVELOPMENT_EARLIEST_DATE:
        fail(
            f"{config_file}: compatibility_date {date or '(none)'}: offline, workerd runs the "
            f"Pyodide 314.0.6 development bundle, which needs a date from "
            f"{DEVELOPMENT_EARLIEST_DATE} (Cloudflare gives {python_workers_hint(date)}); use "
            "a date from 2026-09-08 (python_workers_314), or run with the internet "
            "(PYODIDE_BUNDLE=official)"
        )
    flags = [str(f) for f in config.get("compatibility_flags") or []]
    if bundle == "development":
        flags += [f for f in DEVELOPMENT_FLAGS if f not in flags]
    try:
        plan, plan_source = dev_limits.read_plan(config.get("vars") or {}, dev_vars, os.environ)
    except ValueError as exc:
        fail(str(exc))
    limits = dev_limits.plan_limits(plan, config)
    plan_note = dev_limits.describe(plan, plan_source, limits)
    unenforced = dev_limits.unsupported(config, main_module, is_kit)
    if unenforced:
        plan_note = f"WORKERS_PLAN={plan}: its limits are not enforced ({unenforced})"
    extra = {"DURABLE_AGENTS_AGENT": str(agent_file)} if agent_file else {}
    if bundle == "development" and SNAPSHOT.is_file():
        extra["DURABLE_AGENTS_PYODIDE_SNAPSHOT"] = SNAPSHOT.name
    persist.mkdir(parents=True, exist_ok=True)
    # D1 migrations before `wrangler dev` starts: wrangler serves a request as soon as it
    # listens, and the Worker would fail it for a table not made yet. A local database
    # found up to date needs no wrangler (3-6 s saved); otherwise wrangler's command runs
    # while this server stages the Worker.
    migrated: Future[list[str]] = Future()
    pending = pending_migrations(config_file, config, persist)
    if pending:

        def migrate() -> None:
            try:
                migrated.set_result(apply_migrations(config_file, pending, persist, node_env({})))
            except BaseException as exc:  # handed to the main thread
                migrated.set_exception(exc)

        threading.Thread(target=migrate, daemon=True).start()
    else:
        migrated.set_result([])
    # The Worker's main under the plan's limits: a generated module in a staging folder of
    # this server (dev_limits.Stage), which `wrangler dev` runs as its script.
    stage = None
    wrangler_config = config_file
    if not unenforced:
        stage = dev_limits.Stage(PROJECT, main_module, limits, is_kit, persist)
        atexit.register(stage.close)  # also on fail() and SIGTERM (sys.exit)
    if stage and agent_file is not None:
        given = env_file_settings(with_defaults(settings, agent, "http://127.0.0.1"))
        wrangler_config = serve_kit(stage, config_file, agent_file, agent, list(given))
    script = [str(stage.main)] if stage else []
    env = node_env({**extra, **(stage.env() if stage else {})})

    running: list[subprocess.Popen[str]] = []

    def stop(signum: int, _frame: object) -> None:
        for server in running:
            with contextlib.suppress(ProcessLookupError):
                server.send_signal(signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        sys.exit(128 + signum if signum != signal.SIGINT else 0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    try:
        applied = migrated.result()
    except (RuntimeError, OSError) as exc:  # wrangler failed, or did not run
        fail(f"D1 migrations: {exc}")
    # A free port is free when looked up, not always when wrangler binds it (another
    # server may take it meanwhile): with --port 0, a start that finds any of its ports
    # taken is tried again with new ones, three times.
    for _ in range(3 if options.port == 0 else 1):
        port = options.port or free_port(options.ip)
        origin = f"http://{host}:{port}"
        served = with_defaults(settings, agent, origin) if agent is not None else settings
        notes = settings_notes(served, agent) if agent is not None else []
        env_file = persist / "dev-settings.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            lines = [dotenv_line(k, v) for k, v in env_file_settings(served).items()]
        except ValueError as exc:
            fail(f"the setting {exc}")
        with os.fdopen(fd, "w") as out:
            out.writelines(lines)
        args = [
            "dev", *script, "--config", str(wrangler_config), "--ip", options.ip,
            "--port", str(port),
            "--persist-to", str(persist), "--env-file", str(env_file), "--test-scheduled",
            "--inspector-port", str(free_port("127.0.0.1", avoid=port)),
            "--show-interactive-dev-session=false", "--compatibility-flags", *flags,
        ]  # fmt: skip
        # One start at a time per config: wrangler runs the config's [build] (for this kit
        # without a staging folder, DURABLE_AGENTS_DEV_LIMITS=off: build/worker/, with
        # --agent's module) and bundles from it; another server's build must not change
        # those files before this one has bundled them (until `Ready on`).
        starting = start_lock(config_file)
        # From the config's folder: with a script argument wrangler takes the project (its
        # python_modules/) from the working directory.
        server = wrangler(
            args, env, config_file.parent,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        running[:] = [server]
        assert server.stdout is not None
        ready = port_taken = False
        for line in server.stdout:
            line = ANSI.sub("", line.rstrip("\n"))
            if not ready and "Ready on" in line:
                starting.close()
                ready = True
                notes = [*notes, plan_note]
                announce(config_file, config, bundle, notes, persist, applied, started, origin)
                chat_page = served.get("CHAT_PAGE")
                if agent is not None and chat_page is not None and chat_page.value == "on":
                    say(f"chat page: {origin}/")
                continue
            # Ours (the Worker's port, the inspector's) or one workerd picks itself
            # (`socket "direct:1:default"`, seen once with six servers starting at once).
            if not ready and options.port == 0 and "Address already in use (" in line:
                port_taken = True
                continue
            if NOISE.search(line):
                continue
            print(line.replace("[wrangler:info] ", ""), flush=True)
        code = server.wait()
        starting.close()
        if ready:
            return code
        if not port_taken:
            fail(f"wrangler dev exited ({code}) before the Worker was ready")
        say(f"a port was taken before wrangler could bind it (ours: {port}); trying new ones")
    fail("wrangler dev found no free port in three tries")
    return 1


def announce(
    config_file: Path,
    config: dict[str, Any],
    bundle: str,
    notes: list[str],
    persist: Path,
    migrations: list[str],
    started: float,
    origin: str,
) -> None:
    """The banner: what runs, the agent's settings, where the state is, how fast."""
    where = config_file.relative_to(PROJECT) if config_file.is_relative_to(PROJECT) else None
    name = config.get("name", "worker")
    say(f"{name} ({where or config_file}) on workerd, Pyodide: {bundle_label(bundle)}")
    for note in notes:
        say(note)
    say(f"state in {persist}; D1 migrations: {', '.join(migrations) or 'up to date'}")
    say(f"started in {time.perf_counter() - started:.1f} s")
    say(f"ready on {origin}")


def python_workers_hint(date: str) -> str:
    if date >= "2026-09-08":
        return "it Pyodide 314.0.6"
    return "an earlier date Pyodide 0.28 or 314.0.4, which cannot be had offline"


def bundle_label(bundle: str) -> str:
    if bundle == "official":
        return "Cloudflare's official bundle (fetched by workerd)"
    return "development bundle from npm pyodide (offline; python_workers_development)"


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
