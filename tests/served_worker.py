"""Another project's Worker served by `node runtime/dev-server.mjs --config <its config>`
(what `scripts/dev --config` runs): the process in its own process group, its output, its
URL. Shared by the tests that serve a test Worker of tests/workers/ (or a project made in a
test); `durable_agents.testing.DevWorker` serves this project's own Worker instead."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ServedWorker:
    """One `dev-server.mjs --config ...` process. `env`: the server's whole environment
    (None: this process's)."""

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
        self.process = subprocess.Popen(
            [
                *["node", "runtime/dev-server.mjs", "--config", str(self.config)],
                *["--port", "0", "--persist-to", str(self.state)],
            ],
            cwd=ROOT,
            env=None if self.env is None else dict(self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self.reader.start()

    def start_ready(self, timeout: float = 90) -> None:
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
            if match := re.match(r"ready on (http://\S+)", line):
                self.origin = match[1]

    def wait_ready(self, timeout: float = 60) -> None:
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

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        if self.reader is not None:
            self.reader.join(10)  # the last lines
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.origin).hostname or ""

    @property
    def port(self) -> int:
        return urllib.parse.urlsplit(self.origin).port or 0

    def kill(self) -> None:
        """SIGKILL its process group (workerd included), then collect it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.reader is not None:
            self.reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    close = kill
