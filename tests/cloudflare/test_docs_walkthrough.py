"""The documentation's curl walk-throughs, run as written against `scripts/dev`.

Every ```sh / ```bash block of README.md and docs/ that talks to the dev server
(`http://127.0.0.1:8787`) runs here, in a bash of its page (so a variable set in one
block, `TOKEN=...`, `DIGEST=$(...)`, holds in the next), with the dev server's real
address put in for the documented one. The output each block shows (its `# ` lines)
is checked against what the command printed, `…` standing for any text
(tests/support/doc_blocks.py says how such output is read, and which markers change what
runs).

The server a page talks to is the one its own text starts: a `scripts/dev` line in
one of its shell blocks, `--agent FILE` if given; a bare `scripts/dev` on a page that
has a `src/agent.py` block serves that block (the page replaced the template's agent);
no `scripts/dev` line: the template's agent as shipped, examples/triage/agent.py
(never src/agent.py itself, which is the user's to replace). Pages that share a server run on one
start of it, the template's first, each server stopped before the next starts.
"""

from __future__ import annotations

import queue
import re
import shlex
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.support.doc_blocks import (
    DEV_ORIGINS,
    ROOT,
    Block,
    blocks,
    commands,
    doc_files,
    missing_output,
)

from durable_agents.testing.worker import DevWorker

pytestmark = pytest.mark.slow

# What src/agent.py starts as: the pages that talk to the template's agent talk to this.
TEMPLATE_AGENT = ROOT / "examples" / "triage" / "agent.py"
TOKEN = "dev-token"  # what the docs send: scripts/dev's API_TOKEN when none is set
COMMAND_TIMEOUT_S = 120.0
CRASH_LINE_TIMEOUT_S = 90.0


def _talks_to_the_dev_server(block: Block) -> bool:
    return block.language in ("sh", "bash") and any(o in block.text for o in DEV_ORIGINS)


def _starts_the_server(line: str) -> bool:
    return line.strip().startswith("scripts/dev")


@dataclass
class Page:
    path: Path
    agent: str  # the agent module the page's server serves
    blocks: list[Block] = field(default_factory=list)


def _pages(directory: Path) -> list[Page]:
    pages = []
    for path in doc_files():
        page_blocks = list(blocks(path))
        runnable = [
            b
            for b in page_blocks
            if _talks_to_the_dev_server(b) and not (b.marker or "").startswith("not run")
        ]
        if not runnable:
            continue
        agent = str(TEMPLATE_AGENT)
        starts = [
            line
            for b in page_blocks
            if b.language in ("sh", "bash")
            for line in b.text.splitlines()
            if _starts_the_server(line)
        ]
        if starts:
            words = shlex.split(starts[0].split("#", 1)[0])
            if "--agent" in words:
                agent = words[words.index("--agent") + 1]
            elif own := next((b for b in page_blocks if b.title == "src/agent.py"), None):
                module = directory / f"agent_{own.slug}.py"
                module.write_text(own.text, encoding="utf-8")
                agent = str(module)
        pages.append(Page(path, agent, runnable))
    # The template's pages first; one server per agent.
    return sorted(pages, key=lambda p: (p.agent != str(TEMPLATE_AGENT), p.agent))


class Shell:
    """One bash, fed one command at a time; each command's output and exit status."""

    def __init__(self, cwd: Path) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, command: str, timeout: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
        assert self.process.stdin is not None
        done = f"__docs_walkthrough_done_{uuid.uuid4().hex}__"
        self.process.stdin.write(f"{command}\nprintf '\\n{done} %d\\n' $?\n")
        self.process.stdin.flush()
        output: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                message = f"no end in {timeout} s:\n{command}\n{''.join(output)}"
                raise AssertionError(message) from None
            if line is None:
                raise AssertionError(f"bash exited during:\n{command}\n{''.join(output)}")
            if line.startswith(done):
                return int(line.split()[-1]), "".join(output)
            output.append(line)

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()  # bash exits at the end of its input
        self.process.wait(30)
        self.reader.join(30)
        self.process.stdout.close()


def _local(command: str, worker: DevWorker) -> str:
    for origin in DEV_ORIGINS:
        command = command.replace(origin, worker.url)
    return command


def _walk(page: Page, worker: DevWorker, cwd: Path) -> Iterator[str]:
    """Run the page's walk-through on `worker`; yields what went wrong (nothing: passed)."""
    shell = Shell(cwd)
    try:
        for block in page.blocks:
            steps = [c for c in commands(block) if not _starts_the_server(c.text)]
            crash = re.fullmatch(r'crash after "(.+)"', block.marker or "")
            if crash:  # the reader kills the server while these wait for it
                for step in steps:
                    shell.run(f"{{ {_local(step.text, worker)}\n}} >/dev/null 2>&1 &")
                worker.wait_for_line(re.escape(crash[1]), timeout=CRASH_LINE_TIMEOUT_S)
                worker.kill()
                worker.restart()
                continue
            for step in steps:
                status, output = shell.run(_local(step.text, worker))
                where = f"{block.where}: {step.text}"
                if status != 0:
                    yield f"{where}\nexited {status}:\n{output}"
                elif step.expected and (line := missing_output(step.expected, output)):
                    yield f"{where}\nthe doc shows {line!r}; it printed:\n{output}"
    finally:
        shell.close()


def test_the_curl_walkthroughs_run_as_written(tmp_path: Path) -> None:
    pages = _pages(tmp_path)
    assert len(pages) >= 4, [p.path for p in pages]
    failures: list[str] = []
    worker: DevWorker | None = None
    try:
        for n, page in enumerate(pages):
            if worker is None or worker.agent != page.agent:
                if worker is not None:
                    worker.close()
                worker = DevWorker(
                    ROOT, tmp_path / f"state-{n}", agent=page.agent, token=TOKEN
                ).start()
            cwd = tmp_path / f"page-{n}"
            cwd.mkdir()
            failures += _walk(page, worker, cwd)
    finally:
        if worker is not None:
            worker.close()
    assert not failures, "\n\n".join(failures)
