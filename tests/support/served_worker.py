"""Another project's Worker served by `runtime/dev.py --config <its config>` (what
`scripts/dev --config` runs: `wrangler dev` on real workerd): the process in its own
process group, its output, its URL. Shared by the tests that serve a test Worker of
tests/workers/ (or a project made in a test); `durable_agents.testing.DevWorker` serves
this project's own Worker instead.

wrangler bundles the `python_modules/` folder beside a Worker's config (the Workers SDK,
`from workers import ...`, is in it). A test Worker under tests/workers/ has none of its
own: `start()` links the kit's (`link_python_modules`; the links are gitignored).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from durable_agents.testing.worker import run_wrangler, running_in_group

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "workers"
DEV = ROOT / "runtime" / "dev.py"
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def runtime_module(name: str) -> ModuleType:
    """runtime/<name>.py (the dev server's own modules: dev, dev_limits, deploy_check),
    imported as `name` with runtime/ importable, as they import each other; loaded once."""
    file = ROOT / "runtime" / f"{name}.py"
    if str(file.parent) not in sys.path:
        sys.path.append(str(file.parent))
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(file):
        return loaded
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def link_python_modules(directory: Path) -> None:
    """Give the Worker project in `directory` the kit's python_modules/ (a relative
    symlink), unless it has a python_modules/ of its own."""
    link = directory / "python_modules"
    if link.is_symlink() or link.exists():
        return
    target = os.path.relpath(ROOT / "python_modules", directory)
    with contextlib.suppress(FileExistsError):  # another test made it meanwhile
        link.symlink_to(target, target_is_directory=True)


def wrangler(*args: str, timeout: float = 120) -> str:
    """`scripts/wrangler ARGS` (wrangler as the dev server runs it), offline and
    non-interactive; its stdout. Fails with its output if it fails."""
    env = {**os.environ, "CI": "true", "NO_COLOR": "1", "WRANGLER_SEND_METRICS": "false"}
    return run_wrangler(ROOT, args, env=env, timeout=timeout)


def _group_gone(group: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while running_in_group(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class ServedWorker:
    """One `runtime/dev.py --config ...` process (wrangler dev and its workerd). `env`:
    the server's whole environment (None: this process's)."""

    def __init__(self, config: Path, state: Path, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.state = state
        self.env = env
        self.lines: list[str] = []
        self.origin = ""
        self.process: subprocess.Popen[str] | None = None
        self.reader: threading.Thread | None = None

    def start(self) -> None:
        self.lines = []
        self.origin = ""
        if self.config.resolve().is_relative_to(WORKERS):
            link_python_modules(self.config.resolve().parent)
        python = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
        self.process = subprocess.Popen(
            [
                *[python, str(DEV), "--config", str(self.config)],
                *["--port", "0", "--persist-to", str(self.state)],
            ],
            cwd=ROOT,
            env=None if self.env is None else dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: kill() takes wrangler and workerd
        )
        self.reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self.reader.start()

    def start_ready(self, timeout: float = 120) -> None:
        """`start()`, then `wait_ready()`; the process is killed if it does not get ready."""
        self.start()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))
            if match := re.match(r"dev: ready on (http://\S+)", line):
                self.origin = match[1]

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        assert self.process is not None
        while not self.origin:
            if self.process.poll() is not None:
                if self.reader is not None:
                    self.reader.join(10)
                raise AssertionError(f"{self.config} did not start:\n" + "\n".join(self.lines))
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.config}: not ready in {timeout} s:\n{self.output}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 120) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        if self.reader is not None:
            self.reader.join(10)  # the last lines
        return code

    def wait_line(self, pattern: str, timeout: float = 10) -> str:
        """The last output line matching `pattern` (a regex), waiting for one."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in list(self.lines) if re.search(pattern, line)]
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"no line matches {pattern!r}:\n{self.output[-3000:]}")
            time.sleep(0.02)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.origin).hostname or ""

    @property
    def port(self) -> int:
        return urllib.parse.urlsplit(self.origin).port or 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL its process group (a crash: wrangler and workerd go with it), wait
        until no process of the group is left, then collect it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self._collect()

    def stop(self) -> None:
        """End the server as Ctrl-C would (SIGTERM: dev.py stops wrangler), then make
        sure nothing of it is left."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(20)
        self.kill()

    def _collect(self) -> None:
        assert self.process is not None
        self.process.wait()
        # wrangler and workerd die with it a moment later (their parent-death signal).
        assert _group_gone(self.process.pid), f"{self.config}: its processes outlived it"
        if self.reader is not None:
            self.reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    close = kill
