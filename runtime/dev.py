"""The dev server: a Python Worker served by `wrangler dev` on real workerd, offline.

    scripts/dev [--port 8787] [--ip 127.0.0.1] [--persist-to DIR] [--config FILE]
                [--dev-vars FILE] [--agent FILE]

    --config FILE    any Python Worker's wrangler.toml, .json or .jsonc (default: this
                     repo's wrangler.toml); --persist-to and .dev.vars default to its folder
    --agent FILE     serve this agent module instead of src/agent.py (this kit's Worker only)
    --port 0         any free port (the `ready on` line says which)

What it adds to `wrangler dev` (wrangler reads the config, builds, bundles and runs workerd;
nothing of the Worker's runtime is ours):
- Offline Pyodide. workerd fetches Cloudflare's Pyodide bundle at start. Where that host
  cannot be reached (or PYODIDE_BUNDLE=development), workerd runs with its testing flag
  `python_workers_development` and the same Pyodide assembled from npm
  (scripts/pyodide_bundle.py); runtime/workerd gives it the bundle's folder and
  workerd's baseline snapshot of it. The banner says which bundle runs.
- Settings. For this kit's Worker: [vars], then .dev.vars, then environment variables of
  the kit's settings and the agent module's SETTINGS and DEV_STUBS (later wins), handed to
  wrangler as one env file; API_TOKEN defaults to "dev-token", CHAT_PAGE to "on"; an empty
  setting of DEV_STUBS points at `<this server>/__dev/<NAME>`, served by the Worker's stub.
  The banner lists the agent's settings (values only from [vars], never secrets).
- D1 migrations: `wrangler d1 migrations apply --local` for each database with a
  migrations folder, while the Worker starts.
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
import hashlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import dev_limits  # runtime/, beside this file

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
    "RETENTION_DAYS", "SESSION_STORE", "SELF_RESUME_SECONDS",
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


def fail(message: str) -> None:
    print(f"dev: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def say(message: str) -> None:
    print(f"dev: {message}", flush=True)


# -- the config ----------------------------------------------------------------------------


def _jsonc(text: str) -> Any:
    """JSON with comments and trailing commas, as wrangler.jsonc allows."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        else:
            out.append(c)
            i += 1
    return json.loads(re.sub(r",(\s*[}\]])", r"\1", "".join(out)))


def read_config(file: Path) -> dict[str, Any]:
    """What this server needs of a Worker's config: wrangler reads the rest itself."""
    try:
        text = file.read_text()
        config = tomllib.loads(text) if file.suffix == ".toml" else _jsonc(text)
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
    raise AssertionError


# -- settings ------------------------------------------------------------------------------


def read_dotenv(file: Path) -> dict[str, str]:
    """.dev.vars: KEY=value lines, # comments, optional quotes and `export`."""
    values: dict[str, str] = {}
    if not file.is_file():
        return values
    for line in file.read_text().splitlines():
        match = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$", line)
        if not match:
            continue
        value = match.group(2)
        quoted = re.match(r"^([\"'])(.*)\1$", value, re.S)
        if quoted and quoted.group(1) == '"':
            value = quoted.group(2).replace("\\n", "\n")
        elif quoted:
            value = quoted.group(2)
        else:
            value = re.sub(r"\s+#.*$", "", value)
        values[match.group(1)] = value
    return values


def dotenv_line(name: str, value: str) -> str:
    """A line wrangler's dotenv (with its $-expansion) reads back as exactly `value`."""
    escaped = value.replace("\\", "\\\\").replace("$", "\\$").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n")
    return f'{name}="{escaped}"\n'


def describe_agent(agent_file: Path) -> dict[str, Any]:
    """Import the agent module on CPython (the kit is the same there) and read its names."""
    sys.path.insert(0, str(PROJECT / "src"))
    spec = importlib.util.spec_from_file_location("agent", agent_file)
    if spec is None or spec.loader is None:
        fail(f"cannot load {agent_file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["agent"] = module
    try:
        spec.loader.exec_module(module)
        from durable_agents.cloudflare.agent_module import AgentModule

        description: dict[str, Any] = AgentModule.load(module).describe()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        fail(f"the agent module {agent_file} does not load: {exc}")
    return description


def is_empty(value: object) -> bool:
    return not str(value or "").strip()


def worker_settings(
    config: dict[str, Any], dev_vars: dict[str, str], agent: dict[str, Any] | None, origin: str
) -> tuple[dict[str, str], list[str]]:
    """The Worker's settings beyond [vars] (what the env file holds) and banner notes."""
    names = [*KIT_SETTINGS, *(agent["settings"] + agent["dev_stubs"] if agent else [])]
    vars_ = {k: str(v) for k, v in (config.get("vars") or {}).items()}
    env = dict(dev_vars)
    for name in names:
        if name in os.environ:
            env[name] = os.environ[name]
    notes: list[str] = []
    if agent is None:
        return env, notes
    merged = {**vars_, **env}
    if is_empty(merged.get("API_TOKEN")):
        env["API_TOKEN"] = DEV_TOKEN
        notes.append(f'API_TOKEN is not set: using "{DEV_TOKEN}" (set it in .dev.vars)')
    if is_empty(merged.get("CHAT_PAGE")):
        env["CHAT_PAGE"] = "on"
    stubbed = [name for name in agent["dev_stubs"] if is_empty(merged.get(name))]
    for name in stubbed:
        env[name] = f"{origin}/__dev/{name}"
    if stubbed:
        env["DEV_STUBS"] = "on"
    for name in dict.fromkeys([*agent["settings"], *agent["dev_stubs"]]):
        if name in stubbed:
            notes.append(f"{name} is not set: using the agent's dev stub {env[name]}")
        elif is_empty(merged.get(name)):
            notes.append(f"{name} is not set")
        elif name in vars_ and name not in env:
            notes.append(f"{name}={vars_[name]} (from [vars])")
        else:
            notes.append(f"{name} is set")
    merged = {**vars_, **env}
    provider = str(merged.get("LLM_PROVIDER") or "").strip()
    provider = provider or ("(unset)" if merged.get("LLM_API_KEY") else "demo")
    base_url = merged.get("LLM_BASE_URL")
    at = f" at {base_url}" if provider != "demo" and base_url else ""
    own = " (the agent's make_llm decides)" if agent.get("make_llm") else ""
    store = merged.get("SESSION_STORE") or "d1"
    notes.append(f"agent {agent['agent']}; model: {provider}{at}{own}; session store: {store}")
    return env, notes


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


def apply_migrations(
    config_file: Path, config: dict[str, Any], persist: Path, env: dict[str, str]
) -> list[str]:
    """`wrangler d1 migrations apply --local` for each database with a migrations folder:
    wrangler's own command, so its d1_migrations table stays the record."""
    applied: list[str] = []
    for database in config.get("d1_databases") or []:
        folder = config_file.parent / str(database.get("migrations_dir") or "migrations")
        if not folder.is_dir():
            continue
        name = str(database.get("database_name") or database["binding"])
        args = ["d1", "migrations", "apply", name, "--local", "--persist-to", str(persist),
                "--config", str(config_file)]  # fmt: skip
        child = wrangler(
            args, {**env, "CI": "true"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        output, _ = child.communicate()
        if child.returncode != 0:
            fail(f"wrangler {' '.join(args)} failed (exit {child.returncode}):\n{output}")
        applied += dict.fromkeys(re.findall(r"│\s*(\S+\.sql)\s*│\s*✅", output))
    return applied


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
    options = parser.parse_args(argv)
    if not 0 <= options.port <= 65535:
        fail("--port must be 0-65535")
    config_file = (options.config or find_config()).resolve()
    config = read_config(config_file)
    persist = (options.persist_to or config_file.parent / ".wrangler" / "state").resolve()
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
    # The Worker's main under the plan's limits: a generated module in a staging folder of
    # this server (dev_limits.Stage), which `wrangler dev` runs as its script.
    stage = None
    if not unenforced:
        stage = dev_limits.Stage(PROJECT, main_module, limits, is_kit, persist)
    script = [str(stage.main)] if stage else []
    if stage:
        atexit.register(stage.close)  # also on fail() and SIGTERM (sys.exit)
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

    migrated: list[list[str]] = []
    migrations = threading.Thread(
        target=lambda: migrated.append(apply_migrations(config_file, config, persist, env)),
        daemon=True,
    )
    migrations.start()
    # A free port is free when looked up, not always when wrangler binds it (another
    # server may take it meanwhile): with --port 0, a taken one is replaced, three times.
    for _ in range(3 if options.port == 0 else 1):
        port = options.port or free_port(options.ip)
        origin = f"http://{host}:{port}"
        settings, notes = worker_settings(config, dev_vars, agent, origin)
        env_file = persist / "dev-settings.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.writelines(dotenv_line(k, v) for k, v in settings.items())
        args = [
            "dev", *script, "--config", str(config_file), "--ip", options.ip, "--port", str(port),
            "--persist-to", str(persist), "--env-file", str(env_file), "--test-scheduled",
            "--inspector-port", str(free_port("127.0.0.1", avoid=port)),
            "--show-interactive-dev-session=false", "--compatibility-flags", *flags,
        ]  # fmt: skip
        # One start at a time per config: wrangler runs the config's [build] (for this kit,
        # build/worker/, with --agent's module; under WORKERS_PLAN this server's own staging
        # folder) and bundles from it; another server's build must not change those files
        # before this one has bundled them (until `Ready on`).
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
                migrations.join()
                if not migrated:
                    server.kill()
                    return 1
                ready = True
                notes = [*notes, plan_note]
                announce(config_file, config, bundle, notes, persist, migrated[0], started, origin)
                chat_page = settings.get("CHAT_PAGE", (config.get("vars") or {}).get("CHAT_PAGE"))
                if agent is not None and chat_page == "on":
                    say(f"chat page: {origin}/")
                continue
            if (
                not ready
                and options.port == 0
                and f"Address already in use ({options.ip}:{port})" in line
            ):
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
        say(f"port {port} was taken before wrangler could bind it; trying another")
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
