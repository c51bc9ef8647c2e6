"""tests/support/mcp_server.py (a real MCP server: the official SDK) run as a child
process for a test: started on a free port, its tools' calls read back."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOKEN = "s3cret-token"  # the bearer token the server asks for


@dataclass
class Server:
    """tests/support/mcp_server.py, running; `calls()` reads what its tools received."""

    calls_file: Path
    release_file: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def url(self, endpoint: str = "json") -> str:
        return f"http://127.0.0.1:{self.port}/{endpoint}"

    def start(self, port: int = 0) -> None:
        env = dict(os.environ)
        env.update(
            MCP_TEST_CALLS=str(self.calls_file),
            MCP_TEST_RELEASE=str(self.release_file),
            MCP_TEST_TOKEN=TOKEN,
        )
        with open(self.calls_file.with_name("server.log"), "ab") as log:  # never a full pipe
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "mcp_server.py"), "--port", str(port)],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )
        assert self.proc.stdout is not None
        # Its line, or its exit (end of file), ends the wait; the long cap is for a loaded
        # machine, where importing the MCP SDK and uvicorn alone takes many seconds.
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening "):
            self.stop()
            raise AssertionError(f"the MCP server did not start: {line!r}")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.calls_file.exists():
            return []
        lines = [json.loads(line) for line in self.calls_file.read_text().splitlines()]
        return [c for c in lines if tool is None or c["tool"] == tool]

    def hold(self) -> None:
        """The slow_* tools wait from now on, until `release()`."""
        self.release_file.unlink(missing_ok=True)

    def release(self) -> None:
        self.release_file.touch()
