"""The dev server: a Python Worker served by `wrangler dev` on real workerd, offline.

    scripts/dev [--port 8787] [--ip 127.0.0.1] [--persist-to DIR] [--config FILE]
                [--dev-vars FILE] [--agent FILE] [--agents DIR] [--migrate-only]

    --config FILE    any Python Worker's wrangler.toml, .json or .jsonc (default: this
                     repo's wrangler.toml); --persist-to and .dev.vars default to its folder
    --agent FILE     serve this agent module instead of src/agent.py (this kit's Worker only)
    --agents DIR     serve the agent modules of DIR instead of src/agents/'s, each at
                     /agents/<its file's name>/sessions/... (this kit's Worker only)
    --port 0         any free port (the `ready on` line says which)
    --migrate-only   apply the config's D1 migrations to the local state and exit

What it adds to `wrangler dev` (wrangler reads the config, builds, bundles and runs
workerd; nothing of the Worker's runtime is ours) is told in docs/dev-server.md, how it runs
a Worker offline in runtime/README.md. Here: the start, step by step (`main`: read the
config and the Worker, fail fast on a setting every turn needs, choose the Pyodide bundle,
apply the D1 migrations, stage the Worker under WORKERS_PLAN's limits, start `wrangler dev`,
announce it once ready, stop it on SIGINT/SIGTERM), the processes, the local D1 databases
and the kit's staging. Beside it in runtime/: the settings and the banner's lines on them
(dev_settings.py), the config as wrangler reads it (wrangler_config.py), the agent module on
CPython (agent_checks.py, shared with scripts/check-deploy), the plan's limits
(dev_limits.py). A killed server leaves nothing running: wrangler and workerd die with it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import dev_limits  # runtime/, beside this file
import dev_snapshot
from agent_checks import (
    ServedModules,
    agent_files,
    excluded_modules,
    load_served,
    modules_the_worker_lacks,
    packages_providing,
    shown_path,
    vendored_names,
)
from dev_settings import (
    KIT_SETTINGS,
    Setting,
    dotenv_line,
    env_file_settings,
    model_failure,
    read_dotenv,
    read_settings,
    settings_notes,
    toolset_failure,
    with_defaults,
)
from wrangler_config import ConfigError, load_config, project_config

PROJECT = Path(__file__).resolve().parent.parent
# The Worker's packages (scripts/vendor.py), and its record of what it unpacked: a change
# reloads the Worker (wrangler reads python_modules/ again on a reload, never watches it).
PYTHON_MODULES = PROJECT / "python_modules"
VENDOR_STAMP = PYTHON_MODULES / ".vendor-stamp"
# The module staged beside the kit's entry for this server only (durable_agents.cloudflare.
# agent_module.DEV_SERVER_NOTE, read by serve_agent): the agent file's path and packages.
DEV_SERVER_NOTE = "_durable_agents_dev"
# The project's wrangler on its Node, with runtime/workerd as its workerd.
WRANGLER = PROJECT / "scripts" / "wrangler"
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
# The dedicated snapshots of the kit's imports (runtime/dev_snapshot.py), and the workerd
# binary runtime/workerd runs (a snapshot is its).
DEDICATED_SNAPSHOTS = PROJECT / ".cache" / "dev-snapshot"
WORKERD_BINARIES = (
    PROJECT / "node_modules" / "@cloudflare" / "workerd-linux-64" / "bin" / "workerd",
    PROJECT / "node_modules" / "workerd" / "bin" / "workerd",
)
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


def read_config(file: Path) -> dict[str, Any]:
    """What this server needs of a Worker's config: wrangler reads the rest itself. The
    project's own config has the [vars] of VARS_OVERRIDE's file where that is set."""
    try:
        config = load_config(file)
        replaced = vars_override(file)
    except ConfigError as exc:
        fail(str(exc))
    if replaced is not None:
        config["vars"] = replaced
    return config


# The kit's own tests serve the template's [vars] whatever a user put in wrangler.toml's
# (tests/support/template_vars.toml): a TOML file whose [vars] replace the config's, for
# this server and for the Worker (write_env_file blanks the config's other names).
VARS_OVERRIDE = "DURABLE_AGENTS_VARS"


def vars_override(config_file: Path) -> dict[str, Any] | None:
    """The [vars] of the file VARS_OVERRIDE names for the project's own config; None where
    it is not set, or for another Worker's config."""
    name = os.environ.get(VARS_OVERRIDE)
    if not name or config_file.resolve().parent != PROJECT:
        return None
    try:
        found = tomllib.loads(Path(name).read_text()).get("vars", {})
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{VARS_OVERRIDE}: cannot read {name}: {exc}") from exc
    if not isinstance(found, dict):
        raise ConfigError(f"{VARS_OVERRIDE}: {name} has no [vars] table")
    return found


def find_config() -> Path:
    """The project's own config (wrangler.json, wrangler.jsonc or wrangler.toml)."""
    try:
        return project_config(PROJECT)
    except ConfigError as exc:
        fail(str(exc))


def describe_agent(agent_file: Path | None, agents_dir: Path | None = None) -> ServedModules:
    """The agent modules (`agent_file`, the default agent, and each of `agents_dir`),
    imported on CPython (the kit is the same there) and checked as the Worker checks them
    (`AgentModule`, `served_agents`). One that does not load is said, and the server starts
    all the same without it (its settings, its stubs): the Worker answers its requests with
    the error until an edit of the file fixes it and reloads the Worker."""
    served = load_served(agent_files(agent_file, agents_dir), PROJECT / "src")
    for failure in served.failures.values():
        say(f"the agent module does not load on CPython: {failure}")
    return served


def dev_server_note(
    agent_file: Path,
    packages: Mapping[str, str],
    excluded: Mapping[str, str],
    agents_dir: Path = PROJECT / "src" / "agents",
) -> str:
    """The DEV_SERVER_NOTE module: the agent file and the agents' folder as the Worker's
    errors name them, the packages providing the modules python_modules/ lacks, the modules
    the config's `[python_modules] exclude` leaves out (`excluded_modules`), and
    python_modules/'s stamp (when it changes, the module does, and wrangler reloads the
    Worker with them)."""
    stamp = VENDOR_STAMP.read_text().strip() if VENDOR_STAMP.is_file() else ""
    return (
        '"""Staged by scripts/dev (runtime/dev.py) beside the Worker\'s entry, never deployed: '
        'read by\ndurable_agents.cloudflare.served_agents.serve_agents.\n"""\n\n'
        f"AGENT_FILE = {shown_path(agent_file)!r}\n"
        f"AGENTS_DIR = {shown_path(agents_dir)!r}\n"
        f"PACKAGES = {dict(sorted(packages.items()))!r}\n"
        f"EXCLUDED = {dict(sorted(excluded.items()))!r}\n"
        f"VENDORED = {stamp!r}\n"
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
    stage: dev_limits.Stage,
    config_file: Path,
    worker: Worker,
    secrets: list[str],
    venv_packages: Callable[[], Mapping[str, str]] = packages_providing,
) -> Path:
    """Stage this kit's Worker (scripts/build_worker.py, in this process, with the worker's
    `agent_file` as its default agent and the modules of its `agents_dir`) and keep it
    staged: an edit under src/ or of the agent files (wherever they are) reloads the Worker
    within ~3 s. wrangler gets a copy of the config without [build]
    (written beside the staged Worker; returned): it serves the staged folder and reloads
    when a file there changes, instead of rebuilding on changes under src/ only. An edit
    of the config rewrites the copy, which wrangler follows as it follows a config.

    An edit that breaks the build (a syntax error) or the agent module (checked on CPython
    as at start) leaves the running Worker as it is, and says why. `secrets`: the names the
    env file gives (see dev_config). Staged beside the Worker, DEV_SERVER_NOTE: the agent
    file's path and .venv's packages (`venv_packages()`) for the Worker's errors, and
    python_modules/'s stamp: a change of it (scripts/add-package) reloads the Worker. An
    import python_modules/ lacks is warned of (`packages_check`)."""
    spec = importlib.util.spec_from_file_location(
        "build_worker", PROJECT / "scripts" / "build_worker.py"
    )
    assert spec is not None
    assert spec.loader is not None
    build_worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_worker)
    agent_file, agents_dir, agent = worker.agent_file, worker.agents_dir, worker.agent
    assert agent_file is not None
    assert agents_dir is not None
    os.environ.update(build_env(worker))  # build_worker's agent_override, agents_folder
    copy = stage.dir / "wrangler.json"
    names = (agent.settings, tuple(agent.dev_stubs))
    check_packages = packages_check(venv_packages)
    started = False

    def rebuild() -> None:
        config = read_config(config_file)
        excluded = excluded_modules(config.get("python_modules", {}).get("exclude", ()))
        packages = check_packages(build_worker.stage(stage.source), excluded)
        note = dev_server_note(agent_file, packages, excluded, agents_dir)
        (stage.source / f"{DEV_SERVER_NOTE}.py").write_text(note)
        # At the start, `agent` is the modules just loaded (without those that did not:
        # describe_agent said why, and the Worker will say it to each of their requests).
        files = agent_files(agent_file, agents_dir)
        edited = load_served(files, PROJECT / "src", packages) if started else agent
        if started and edited.failures:  # an edit that breaks one: the Worker stays as it is
            raise SystemExit("; ".join(edited.failures.values()))
        if (edited.settings, tuple(edited.dev_stubs)) != names:
            say("the agent's SETTINGS or DEV_STUBS changed: they are passed from the next start")
        copied = dev_config(config, config_file, stage.main, secrets)
        text = json.dumps(copied, indent=2, default=str)
        if not copy.is_file() or copy.read_text() != text:
            if copy.is_file():
                say(f"{config_file.name} changed: the Worker reloads with it")
            copy.write_text(text)

    try:
        rebuild()
    except (Exception, SystemExit) as exc:
        fail(f"cannot stage the Worker: {exc}")
    started = True
    stage.sync()
    watched = [PROJECT / "src", agent_file, agents_dir, config_file, VENDOR_STAMP]
    stage.follow(watched, rebuild, say)
    return copy


def packages_check(
    venv_packages: Callable[[], Mapping[str, str]],
) -> Callable[[Mapping[str, Path], Mapping[str, str]], dict[str, str]]:
    """A check of the staged modules against python_modules/ (`modules_the_worker_lacks`):
    each call says a new finding once (a warning: the server runs on, and the Worker answers
    each request with the import's error), and returns what the Worker's errors name a
    module's package with: .venv's packages (`venv_packages()`, read again when a missing
    module is not among them) by import name, those python_modules/ has left out. So the
    Worker's note changes with python_modules/, not with an edit of the agent: wrangler
    reloads the Worker once per file changed."""
    known: dict[str, str] = {}
    said = [""]

    def packages(names: Iterable[str] = ()) -> Mapping[str, str]:
        if not known:
            known.update(venv_packages())
        if not set(names) <= known.keys():
            known.update(packages_providing())
        return known

    def check(modules: Mapping[str, Path], excluded: Mapping[str, str]) -> dict[str, str]:
        missing = modules_the_worker_lacks(modules, PYTHON_MODULES, packages, excluded)
        text = "; ".join(m.describe() for m in missing)
        if text and text != said[0]:
            say(
                f"warning: {text}. Until then the Worker answers every request with the import's "
                "error; this server keeps running and reloads the Worker when python_modules/ "
                "changes"
            )
        said[0] = text
        vendored = vendored_names(PYTHON_MODULES) if PYTHON_MODULES.is_dir() else set()
        return {name: package for name, package in packages().items() if name not in vendored}

    return check


def read_in_background(read: Callable[[], dict[str, str]]) -> Callable[[], dict[str, str]]:
    """`read()` started now in a thread of its own; the function returned waits for it."""
    result: Future[dict[str, str]] = Future()

    def run() -> None:
        try:
            result.set_result(read())
        except BaseException as exc:  # handed to the caller
            result.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return result.result


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


# -- the start, step by step ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Worker:
    """The Worker this server serves, as read before anything starts: its config, its main
    module, and for this kit's Worker (`is_kit`) the agent module and its settings."""

    config_file: Path
    config: dict[str, Any]
    main_module: Path
    is_kit: bool
    agent_file: Path | None  # the default agent's module (it may not exist: agents_dir only)
    agent: ServedModules | None  # the agent modules, loaded; None for another Worker
    dev_vars_file: Path
    dev_vars: dict[str, str]
    settings: dict[str, Setting]
    agents_dir: Path | None = None  # the folder of the other agent modules (src/agents/)


@dataclass(frozen=True, slots=True)
class Limits:
    """WORKERS_PLAN's limits, the banner's line on them, and why they are not enforced on
    this Worker (None when they are)."""

    limits: dict[str, int]
    note: str
    unenforced: str | None


@dataclass(frozen=True, slots=True)
class Launch:
    """What each try at starting `wrangler dev` is given (see `serve`)."""

    worker: Worker
    options: argparse.Namespace
    host: str  # options.ip as a URL writes it
    persist: Path
    script: list[str]  # the staged main module, when there is one
    wrangler_config: Path  # the config, or the staged copy of it
    flags: list[str]
    env: dict[str, str]
    bundle: str
    plan_note: str
    started: float
    on_ready: Callable[[], None] = lambda: None  # after the banner


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/dev", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--ip", default="127.0.0.1")
    parser.add_argument("--persist-to", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--dev-vars", type=Path)
    parser.add_argument("--agent", type=Path)
    parser.add_argument("--agents", type=Path)
    parser.add_argument("--migrate-only", action="store_true")
    options = parser.parse_args(argv)
    if not 0 <= options.port <= 65535:
        fail("--port must be 0-65535")
    return options


def migrate_only(config_file: Path, config: Mapping[str, Any], persist: Path) -> int:
    """--migrate-only: the config's D1 migrations applied to the state under `persist`."""
    persist.mkdir(parents=True, exist_ok=True)
    try:
        pending = pending_migrations(config_file, config, persist)
        applied = apply_migrations(config_file, pending, persist, node_env({}))
    except (RuntimeError, OSError) as exc:
        fail(f"D1 migrations: {exc}")
    say(f"state in {persist}; D1 migrations: {', '.join(applied) or 'up to date'}")
    return 0


def read_worker(options: argparse.Namespace, config_file: Path, config: dict[str, Any]) -> Worker:
    """The Worker to serve: this kit's (its main in build/worker/: the agent module is
    loaded, --agent's or src/agent.py) or another's, with the settings it is given."""
    dev_vars_file = options.dev_vars or config_file.parent / ".dev.vars"
    dev_vars = read_dotenv(dev_vars_file.resolve())
    main_module = (config_file.parent / config["main"]).resolve()
    is_kit = config_file.parent == PROJECT and main_module.parent == PROJECT / "build" / "worker"
    agent_file, agents_dir = agent_paths(options, is_kit)
    agent = describe_agent(agent_file, agents_dir) if is_kit else None
    if agent is not None and not agent.files:
        fail("no agent module: write src/agent.py (the default agent) or src/agents/<name>.py")
    try:
        names = [*KIT_SETTINGS, *(agent.settings + tuple(agent.dev_stubs) if agent else ())]
    except Exception as exc:  # two modules' DEV_STUBS differ on a setting
        fail(str(exc))
    settings = read_settings(config, dev_vars, names)
    return Worker(
        config_file=config_file, config=config, main_module=main_module, is_kit=is_kit,
        agent_file=agent_file, agent=agent, dev_vars_file=dev_vars_file, dev_vars=dev_vars,
        settings=settings, agents_dir=agents_dir,
    )  # fmt: skip


def agent_paths(options: argparse.Namespace, is_kit: bool) -> tuple[Path | None, Path | None]:
    """The default agent's module (--agent, else src/agent.py, which may not exist) and the
    folder of the others (--agents, else src/agents/); none for another Worker."""
    if not is_kit:
        for option, given in (("--agent", options.agent), ("--agents", options.agents)):
            if given is not None:
                fail(f"{option}: only this kit's Worker serves agent modules")
        return None, None
    agent_file = (options.agent or PROJECT / "src" / "agent.py").resolve()
    agents_dir = (options.agents or PROJECT / "src" / "agents").resolve()
    if options.agent is not None and (agent_file.suffix != ".py" or not agent_file.is_file()):
        fail(f"--agent: no Python file at {agent_file}")
    if options.agents is not None and not agents_dir.is_dir():
        fail(f"--agents: no folder at {agents_dir}")
    return agent_file, agents_dir


def check_turns_can_run(worker: Worker, origin: str) -> None:
    """Fail fast: stop the server when every turn would fail for want of a setting (the
    agent's model, or one its toolsets read)."""
    if worker.agent is None:
        return
    placeholder = with_defaults(worker.settings, worker.agent, origin)
    for agent in worker.agent.modules.values():
        failure = model_failure(
            agent, placeholder, worker.config, worker.dev_vars_file
        ) or toolset_failure(agent, placeholder, worker.config_file, worker.dev_vars_file)
        if failure:
            fail(failure)


def compatibility_flags(config_file: Path, config: Mapping[str, Any], bundle: str) -> list[str]:
    """The config's compatibility flags, with the development bundle's where it runs;
    stops the server for a compatibility date that bundle cannot start with."""
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
    return flags


def workers_plan(worker: Worker) -> Limits:
    """WORKERS_PLAN's limits for this Worker (runtime/dev_limits.py)."""
    config = worker.config
    try:
        plan, plan_source = dev_limits.read_plan(
            config.get("vars") or {}, worker.dev_vars, os.environ
        )
    except ValueError as exc:
        fail(str(exc))
    limits = dev_limits.plan_limits(plan, config)
    note = dev_limits.describe(plan, plan_source, limits)
    unenforced = dev_limits.unsupported(config, worker.main_module, worker.is_kit)
    if unenforced:
        note = f"WORKERS_PLAN={plan}: its limits are not enforced ({unenforced})"
    return Limits(limits, note, unenforced)


def start_migrations(
    config_file: Path, config: Mapping[str, Any], persist: Path
) -> Future[list[str]]:
    """The migrations of each D1 database not up to date, applied in a thread of their own
    while the Worker is staged; the future holds those applied."""
    # D1 migrations before `wrangler dev` starts: wrangler serves a request as soon as it
    # listens, and the Worker would fail it for a table not made yet. A local database
    # found up to date needs no wrangler (3-6 s saved); otherwise wrangler's command runs
    # while this server stages the Worker.
    migrated: Future[list[str]] = Future()
    pending = pending_migrations(config_file, config, persist)
    if not pending:
        migrated.set_result([])
        return migrated
    names = ", ".join(str(db.get("database_name") or db.get("binding")) for db in pending)
    say(f"D1 migrations to apply ({names}): wrangler d1 migrations apply --local")

    def migrate() -> None:
        try:
            migrated.set_result(apply_migrations(config_file, pending, persist, node_env({})))
        except BaseException as exc:  # handed to the main thread
            migrated.set_exception(exc)

    threading.Thread(target=migrate, daemon=True).start()
    return migrated


def stage_worker(
    worker: Worker,
    limits: Limits,
    persist: Path,
    venv_packages: Callable[[], Mapping[str, str]] = packages_providing,
    preload: tuple[str, ...] | None = None,
) -> tuple[dev_limits.Stage | None, Path]:
    """The Worker's main under the plan's limits: a generated module in a staging folder of
    this server (dev_limits.Stage), which `wrangler dev` runs as its script; and the config
    wrangler is given (for this kit's Worker, the staged copy: see serve_kit). No stage
    where the limits are not enforced. `preload`: the main is for a dedicated snapshot
    (dev_snapshot)."""
    if limits.unenforced:
        return None, worker.config_file
    stage = dev_limits.Stage(
        PROJECT, worker.main_module, limits.limits, worker.is_kit, persist, preload
    )
    atexit.register(stage.close)  # also on fail() and SIGTERM (sys.exit)
    if worker.agent is None:
        return stage, worker.config_file
    given = env_file_settings(with_defaults(worker.settings, worker.agent, "http://127.0.0.1"))
    copy = serve_kit(stage, worker.config_file, worker, list(given), venv_packages)
    return stage, copy


def build_env(worker: Worker) -> dict[str, str]:
    """What scripts/build_worker.py is told of the agent modules: the default one's file
    (where it exists) and the folder of the others."""
    if worker.agent_file is None or worker.agents_dir is None:
        return {}
    found = {"DURABLE_AGENTS_AGENTS": str(worker.agents_dir)}
    if worker.agent_file.is_file():
        found["DURABLE_AGENTS_AGENT"] = str(worker.agent_file)
    return found


def wrangler_env(worker: Worker, bundle: str, stage: dev_limits.Stage | None) -> dict[str, str]:
    """The environment `wrangler dev` runs in: this process's, without colours, with the
    agent file (for scripts/build_worker.py), the baseline snapshot workerd loads and the
    staging folder."""
    return node_env({**build_env(worker), **snapshot_env(bundle), **(stage.env() if stage else {})})


def snapshot_env(bundle: str) -> dict[str, str]:
    """What runtime/workerd is told of the baseline snapshot to start from (development
    bundle only; scripts/bench_dev_start.py gives the bare Worker it compares with the same)."""
    if bundle == "development" and SNAPSHOT.is_file():
        return {"DURABLE_AGENTS_PYODIDE_SNAPSHOT": SNAPSHOT.name}
    return {}


def dedicated_snapshot(
    stage: dev_limits.Stage, config_file: Path, flags: Sequence[str]
) -> dev_snapshot.Snapshot:
    """This server's dedicated snapshot (runtime/dev_snapshot.py), keyed to the staged kit,
    python_modules/, workerd, the bundle and the config's runtime fields as they are now;
    taken away from the reloads after an edit that changes them."""
    workerd = next((b for b in WORKERD_BINARIES if b.is_file()), WORKERD_BINARIES[0])
    bundle_stamp = SNAPSHOT.parent / "pyodide_dev.capnp.bin.stamp"

    def key() -> str | None:
        if not workerd.is_file() or not bundle_stamp.is_file():
            return None
        config = read_config(config_file)
        runtime = {
            "date": config.get("compatibility_date"), "flags": list(flags),
            "python_modules": config.get("python_modules"), "bundle": bundle_stamp.read_text(),
        }  # fmt: skip
        files = dev_snapshot.kit_files(stage.source, stage.extra)
        return dev_snapshot.snapshot_key(files, stage.dir, VENDOR_STAMP, workerd, runtime)

    snapshot = dev_snapshot.Snapshot(DEDICATED_SNAPSHOTS, stage.dir / "snapshot", key)
    stage.before_sync.append(snapshot.check)
    atexit.register(snapshot.close)
    return snapshot


def from_snapshot(
    stage: dev_limits.Stage,
    config_file: Path,
    wrangler_config: Path,
    flags: list[str],
    env: dict[str, str],
) -> tuple[list[str], dict[str, str], Callable[[], None]]:
    """The flags and environment of a start from the dedicated snapshot where one is cached;
    otherwise those given, and what saves one once the server is ready."""
    snapshot = dedicated_snapshot(stage, config_file, flags)
    if snapshot.use():
        where = shown_path(DEDICATED_SNAPSHOTS)
        say(f"the Worker starts from a memory snapshot of the kit's imports ({where})")
        return [*flags, dev_snapshot.FLAG], {**env, **snapshot.env()}, lambda: None
    base = ["dev", str(stage.main), "--config", str(wrangler_config), "--ip", "127.0.0.1"]
    return flags, env, lambda: save_snapshot(snapshot, base, flags, env, config_file)


def save_snapshot(
    snapshot: dev_snapshot.Snapshot,
    base: list[str],
    flags: list[str],
    env: dict[str, str],
    config_file: Path,
) -> None:
    """Have a second `wrangler dev` of the staged Worker (`base`, its own ports) save the
    dedicated snapshot in the background, at the lowest priority, for the next start."""

    def start(extra: list[str], saving: dict[str, str]) -> subprocess.Popen[str]:
        port = free_port("127.0.0.1")
        args = [
            *base, "--port", str(port), "--inspector-port", str(free_port("127.0.0.1", port)),
            "--show-interactive-dev-session=false", *extra,
            "--compatibility-flags", *flags, dev_snapshot.FLAG,
        ]  # fmt: skip
        saver = wrangler(
            args, saving, config_file.parent,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        with contextlib.suppress(OSError):  # before node starts workerd, which inherits it
            os.setpriority(os.PRIO_PROCESS, saver.pid, 19)
        return saver

    snapshot.save_in_background(start, [], env, say)


def stop_on_signals(running: list[subprocess.Popen[str]]) -> None:
    """SIGTERM and SIGINT (Ctrl-C) stop the running wrangler, then this process (exit 0
    for Ctrl-C, 128 + the signal's number otherwise)."""

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


def migrations_applied(migrated: Future[list[str]]) -> list[str]:
    try:
        return migrated.result()
    except (RuntimeError, OSError) as exc:  # wrangler failed, or did not run
        fail(f"D1 migrations: {exc}")


def write_env_file(persist: Path, served: Mapping[str, Setting], config_file: Path) -> Path:
    """The env file for `wrangler dev --env-file` (mode 600: it holds secrets). With
    VARS_OVERRIDE, it also holds the replacing [vars], and blanks every other name of the
    config's own [vars] (wrangler reads those from the config)."""
    env_file = persist / "dev-settings.env"
    given = env_file_settings(served)
    if vars_override(config_file) is not None:
        own = load_config(config_file).get("vars") or {}
        replaced = {k: s.value for k, s in served.items() if s.source == "[vars]"}
        given = {**dict.fromkeys(own, ""), **replaced, **given}
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        lines = [dotenv_line(k, v) for k, v in given.items()]
    except ValueError as exc:
        fail(f"the setting {exc}")
    with os.fdopen(fd, "w") as out:
        out.writelines(lines)
    return env_file


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    # Bytecode outside src/ (wrangler reloads on any change there), kept for the next start:
    # the agent's check imports the kit, pydantic and httpx here (~0.15 s more compiled
    # anew). Where writing bytecode is turned off (PYTHONDONTWRITEBYTECODE), none is.
    if not sys.dont_write_bytecode and sys.pycache_prefix is None:
        sys.pycache_prefix = str(PROJECT / ".cache" / "pycache")
    options = parse_options(argv)
    # ~0.15 s of reading .venv's packages (for the Worker's errors) while the start goes on.
    venv_packages = read_in_background(packages_providing)
    config_file = (options.config or find_config()).resolve()
    config = read_config(config_file)
    persist = (options.persist_to or config_file.parent / ".wrangler" / "state").resolve()
    if options.migrate_only:
        return migrate_only(config_file, config, persist)
    worker = read_worker(options, config_file, config)
    host = f"[{options.ip}]" if ":" in options.ip else options.ip
    check_turns_can_run(worker, f"http://{host}:{options.port}")
    bundle = bundle_choice()
    flags = compatibility_flags(config_file, config, bundle)
    limits = workers_plan(worker)
    persist.mkdir(parents=True, exist_ok=True)
    migrated = start_migrations(config_file, config, persist)
    wanted = dev_snapshot.enabled(worker.is_kit, bundle, not limits.unenforced)
    preload = dev_snapshot.preload(PROJECT / "src" / "entry.py") if wanted else None
    stage, wrangler_config = stage_worker(worker, limits, persist, venv_packages, preload)
    env = wrangler_env(worker, bundle, stage)
    script = [str(stage.main)] if stage else []
    on_ready: Callable[[], None] = lambda: None  # noqa: E731
    if stage is not None and preload is not None:
        flags, env, on_ready = from_snapshot(stage, config_file, wrangler_config, flags, env)
    launch = Launch(
        worker=worker, options=options, host=host, persist=persist, script=script,
        wrangler_config=wrangler_config, flags=flags, env=env, bundle=bundle,
        plan_note=limits.note, started=started, on_ready=on_ready,
    )  # fmt: skip
    running: list[subprocess.Popen[str]] = []
    stop_on_signals(running)
    return serve(launch, migrations_applied(migrated), running)


# -- wrangler dev ---------------------------------------------------------------------------


def serve(launch: Launch, applied: list[str], running: list[subprocess.Popen[str]]) -> int:
    """Run `wrangler dev` until it exits; its exit status. A free port is free when looked
    up, not always when wrangler binds it (another server may take it meanwhile): with
    --port 0, a start that finds any of its ports taken is tried again with new ones,
    three times."""
    options = launch.options
    for _ in range(3 if options.port == 0 else 1):
        port = options.port or free_port(options.ip)
        ready, port_taken, code = run_wrangler_dev(launch, port, applied, running)
        if ready:
            return code
        if not port_taken:
            fail(f"wrangler dev exited ({code}) before the Worker was ready")
        say(f"a port was taken before wrangler could bind it (ours: {port}); trying new ones")
    fail("wrangler dev found no free port in three tries")


def run_wrangler_dev(
    launch: Launch, port: int, applied: list[str], running: list[subprocess.Popen[str]]
) -> tuple[bool, bool, int]:
    """One start of `wrangler dev` on `port`, followed until it exits (the banner when it is
    ready): whether it got ready, whether a port was taken before, its exit status."""
    worker, options = launch.worker, launch.options
    origin = f"http://{launch.host}:{port}"
    agent = worker.agent
    served = with_defaults(worker.settings, agent, origin) if agent is not None else worker.settings
    notes = [*settings_notes(served, agent), *agent.paths(origin)] if agent is not None else []
    env_file = write_env_file(launch.persist, served, worker.config_file)
    args = [
        "dev", *launch.script, "--config", str(launch.wrangler_config), "--ip", options.ip,
        "--port", str(port),
        "--persist-to", str(launch.persist), "--env-file", str(env_file), "--test-scheduled",
        "--inspector-port", str(free_port("127.0.0.1", avoid=port)),
        "--show-interactive-dev-session=false", "--compatibility-flags", *launch.flags,
    ]  # fmt: skip
    # One start at a time per config that wrangler builds: it runs the config's [build]
    # (for this kit without a staging folder, DURABLE_AGENTS_DEV_LIMITS=off: build/worker/,
    # with --agent's module) and bundles from it; another server's build must not change
    # those files before this one has bundled them (until `Ready on`). A staged copy of
    # the config (serve_kit) has no [build]: its server starts beside the others.
    staged_copy = launch.wrangler_config != worker.config_file
    starting = contextlib.ExitStack()
    if not staged_copy:
        starting.enter_context(start_lock(worker.config_file))
    # From the config's folder: with a script argument wrangler takes the project (its
    # python_modules/) from the working directory.
    server = wrangler(
        args, launch.env, worker.config_file.parent,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    running[:] = [server]

    def ready_now() -> None:
        starting.close()
        announce(
            worker.config_file, worker.config, launch.bundle, [*notes, launch.plan_note],
            launch.persist, applied, launch.started, origin,
        )  # fmt: skip
        chat_page = served.get("CHAT_PAGE")
        if agent is not None and chat_page is not None and chat_page.value == "on":
            say(f"chat page: {origin}/")
        launch.on_ready()

    ready, port_taken = relay_output(server, ready_now, watch_ports=options.port == 0)
    code = server.wait()
    starting.close()
    return ready, port_taken, code


def relay_output(
    server: subprocess.Popen[str], on_ready: Callable[[], None], watch_ports: bool
) -> tuple[bool, bool]:
    """Print wrangler's output until it ends, without its noise; `on_ready` at its `Ready
    on`. Whether it got ready, and (`watch_ports`: with --port 0) whether a port was
    taken before it did."""
    assert server.stdout is not None
    ready = port_taken = False
    for line in server.stdout:
        line = ANSI.sub("", line.rstrip("\n"))
        if not ready and "Ready on" in line:
            ready = True
            on_ready()
            continue
        # Ours (the Worker's port, the inspector's) or one workerd picks itself
        # (`socket "direct:1:default"`, seen once with six servers starting at once).
        if not ready and watch_ports and "Address already in use (" in line:
            port_taken = True
            continue
        if NOISE.search(line):
            continue
        print(line.replace("[wrangler:info] ", ""), flush=True)
    return ready, port_taken


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
