"""The dev server and wrangler's CLI, for the benchmarks and checks of scripts/ and their tests.

    with DevServer(["--agent", "examples/triage/agent.py"], state_dir) as server:
        print(server.url, server.start_s)    # dev.py's `ready on` and `started in` lines
    output = wrangler(["d1", "execute", "durable-agents", "--local", ...])

`DevServer` runs `scripts/dev` (runtime/dev.py: `wrangler dev` on real workerd, offline)
on a free port, in a process group of its own, and waits for its `dev: ready on URL`
line; `stop()` ends it with SIGTERM, as Ctrl-C would, then kills whatever of its group is
left. `WranglerDev` does the same for `wrangler dev` alone (no scripts/dev), the bare
Worker a benchmark compares with. `wrangler()` runs scripts/wrangler: wrangler's CLI on the
pinned Node 22 (runtime/node) with this repo's workerd (runtime/workerd); the machine's
own Node may be too old for it. scripts/wrangler sets the runtime up if needed.
`scratch_worker` writes a Worker project of its own (the kit's runtime settings, a link
to python_modules/) for the scripts that serve one from a scratch folder.

stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
WRANGLER = PROJECT / "scripts" / "wrangler"  # the pinned wrangler on the pinned Node
# Settings the dev server reads from its environment (KIT_SETTINGS of
# runtime/dev_settings.py, the triage agent's, its stubs' switch): a developer's shell must
# not change what a benchmark measures.
SETTINGS = (
    "API_TOKEN", "MAX_BODY_BYTES", "LLM_PROVIDER", "LLM_MODEL", "LLM_BASE_URL", "LLM_API_KEY",
    "CHAT_PAGE", "SESSION_TOKEN_SECRET", "MAX_SESSION_TOKENS", "MAX_CONTEXT_TOKENS",
    "RETENTION_DAYS", "SESSION_STORE", "SELF_RESUME_SECONDS", "WORKERS_PLAN", "ISSUES_API_URL",
    "SLACK_WEBHOOK_URL", "DEV_STUBS",
)  # fmt: skip


def _environment() -> dict[str, str]:
    """This process's environment without the settings the dev server would read."""
    return {k: v for k, v in os.environ.items() if k not in SETTINGS}


def wrangler_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = _environment()
    env.update(
        CI="true",  # no prompts (`d1 migrations apply` asks before applying otherwise)
        NO_COLOR="1",
        FORCE_COLOR="0",
    )
    env.update(extra or {})
    return env


def wrangler(args: Sequence[str], *, cwd: Path = PROJECT, timeout: float = 300) -> str:
    """Run `wrangler ARGS`; its output (stdout, then stderr). Raises SystemExit, with
    the output, if it fails."""
    command = [str(WRANGLER), *args]
    done = subprocess.run(
        command, cwd=cwd, env=wrangler_env(), capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"wrangler {' '.join(args)} failed (exit {done.returncode}):\n{output}")
    return output


class DevServer:
    """`scripts/dev --port 0 ARGS` until `stop()`. `env`: settings for the server's
    environment (the others of SETTINGS are removed from it). `project`: the checkout
    whose scripts/dev runs (this one by default; a benchmark may compare another)."""

    READY = re.compile(r"^dev: ready on (\S+)")

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 240,
        project: Path = PROJECT,
    ) -> None:
        self.args = list(args)
        self.env = dict(env or {})
        self.timeout = timeout
        self.project = project
        self.url = ""
        self.start_s = 0.0  # dev.py's own figure: from its start to workerd's `Ready on`
        self.ready_s = 0.0  # from starting the process to its ready line, as seen from here
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None
        self._started = 0.0

    def command(self) -> list[str]:
        return [str(self.project / "scripts" / "dev"), "--port", "0", *self.args]

    def environment(self) -> dict[str, str]:
        return {**_environment(), **self.env}

    def start(self) -> DevServer:
        self._started = time.perf_counter()
        self.process = subprocess.Popen(
            self.command(), cwd=self.project, env=self.environment(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own group: stop() takes wrangler and workerd too
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self._reader.start()
        if not self._ready.wait(self.timeout) or not self.url:
            self.stop()
            raise SystemExit(
                f"the dev server ({' '.join(self.args)}) did not start within "
                f"{self.timeout:.0f} s:\n{self.output[-4000:]}"
            )
        return self

    def _read(self, process: subprocess.Popen[str]) -> None:
        """Keep its output (and drain the pipe, one line per request, so it never fills)."""
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if started := re.match(r"dev: started in ([\d.]+) s", line):
                self.start_s = float(started.group(1))
            if not self.url and (ready := self.READY.search(line)):
                self.ready_s = time.perf_counter() - self._started
                self.url = ready.group(1)
                self._ready.set()
        self._ready.set()  # it exited

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        """SIGTERM (dev.py stops wrangler, which stops workerd), then SIGKILL to whatever of
        its process group is left."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # its workerd goes a moment after the signal
            try:
                os.killpg(process.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        if self._reader is not None:
            self._reader.join(10)  # its last lines
        if process.stdout is not None:
            process.stdout.close()
        self.process = None

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WranglerDev(DevServer):
    """`wrangler dev ARGS` alone (scripts/wrangler, no scripts/dev) until `stop()`, from the
    folder `project`: the bare Worker a benchmark compares scripts/dev with. ARGS name the
    port; `env` is added to wrangler's environment (wrangler_env)."""

    READY = re.compile(r"Ready on (http\S+)")

    def command(self) -> list[str]:
        return [str(WRANGLER), "dev", *self.args]

    def environment(self) -> dict[str, str]:
        return wrangler_env(self.env)


# What a Worker of its own in a scratch folder takes from the kit's config by default: the
# runtime it gets (Pyodide's version follows the date and flags) and what it uploads.
RUNTIME_FIELDS = ("compatibility_date", "compatibility_flags", "python_modules")


def scratch_worker(
    project: Path,
    main: str,
    *,
    config: Path = PROJECT / "wrangler.toml",
    kept: Sequence[str] = RUNTIME_FIELDS,
    python_modules: Path = PROJECT / "python_modules",
    **fields: Any,
) -> Path:
    """A Worker project in `project` (a scratch folder) for `scripts/dev --config` or
    `wrangler dev`: python_modules/ a link to `python_modules`, and wrangler.json (its path
    returned) holding the `kept` fields of `config` (a TOML config; D1's migrations
    folders made absolute, so they stay the config's), `main` (relative to `project`)
    and `fields`. The Worker's modules are the caller's to put in place."""
    project.mkdir(parents=True, exist_ok=True)
    (project / "python_modules").symlink_to(python_modules, target_is_directory=True)
    source = tomllib.loads(config.read_text())
    worker: dict[str, Any] = {key: source[key] for key in kept if key in source}
    for database in worker.get("d1_databases", []):
        migrations = config.parent / str(database.get("migrations_dir") or "migrations")
        database["migrations_dir"] = str(migrations.resolve())
    worker.update(fields, main=main)
    file = project / "wrangler.json"
    file.write_text(json.dumps(worker, indent=2))
    return file
