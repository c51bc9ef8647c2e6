"""The code blocks of README.md and docs/**/*.md, for the tests that check them
(tests/test_docs.py: the Python blocks; tests/cloudflare/test_docs_walkthrough.py: the
curl walk-throughs).

A block is a fenced block (three backticks and an info string such as `python`,
`python title="src/agent.py"` or `sh`). What the tests do with it may be said by an
HTML comment on the line right before its fence (blank lines allowed in between):

    <!-- docs-test: fragment -->        a Python block that is not a whole program
                                        (names from the text around it, a top-level
                                        await): linted and type-checked with those
                                        allowed (`FRAGMENT_RUFF` / `FRAGMENT_MYPY`),
                                        never run
    <!-- docs-test: lint only (why) --> a whole Python program that is not run
                                        (it needs a dev server, a fake service...):
                                        linted and type-checked like any other
    <!-- docs-test: not run (why) -->   a shell block with curl against
                                        127.0.0.1:8787 that the walk-through skips
    <!-- docs-test: crash after "TEXT" -->
                                        a shell block the walk-through runs in the
                                        background; once the dev server prints a line
                                        holding TEXT it kills the server (SIGKILL) and
                                        starts it again on the same state

Everything else runs: a Python block titled `src/agent.py` is an agent module (run
through `check_agent`), one titled `tests/test_*.py` a pytest module, any other a
program (`python block.py`).

Expected output in shell blocks: the `# ` comment lines right after a command are
what it prints. `…` stands for any text within a line; a line `...` for any lines;
a comment line starting `#  ` (two spaces or more) continues the line above it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<what>.*?)\s*-->$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
# The dev server of the walk-throughs, as the docs write it.
DEV_ORIGINS = ("http://127.0.0.1:8787", "http://localhost:8787", "localhost:8787")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language and title, its marker, its text."""

    path: Path
    line: int  # of the opening fence, from 1
    language: str
    title: str | None
    marker: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def slug(self) -> str:
        """A file-name-safe id, unique per block."""
        stem = re.sub(r"[^A-Za-z0-9]+", "_", str(self.path.relative_to(ROOT).with_suffix("")))
        return f"{stem}_{self.line}".lower()


def doc_files() -> list[Path]:
    """README.md, then every page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    marker: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if found := _MARKER.match(line.strip()):
            marker = found["what"]
        elif fence := _FENCE.match(line):
            info = fence["info"].strip()
            body: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(fence["indent"]) :])
                j += 1
            language = info.split(" ", 1)[0] if info else ""
            title = m["title"] if (m := _TITLE.search(info)) else None
            yield Block(path, i + 1, language, title, marker, "\n".join(body) + "\n")
            marker = None
            i = j
        elif line.strip():
            marker = None
        i += 1


def all_blocks(language: str | tuple[str, ...]) -> list[Block]:
    wanted = (language,) if isinstance(language, str) else language
    return [b for path in doc_files() for b in blocks(path) if b.language in wanted]


@dataclass(frozen=True)
class Command:
    """One shell command of a block (backslash continuations joined) and the output
    the doc shows for it: one string per line, `...` for any lines."""

    text: str
    expected: list[str]


def commands(block: Block) -> list[Command]:
    """The block's commands, each with the `# ` lines that follow it as its output."""
    found: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.lstrip().startswith("#"):
            if found:  # output of the command before; a comment before any command is prose
                text = line.lstrip()[1:]
                expected = found[-1].expected
                if text.startswith("  ") and expected:
                    expected[-1] += text.strip()
                else:
                    expected.append(text.strip())
            i += 1
            continue
        command = [line]
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        found.append(Command("\n".join(command), []))
        i += 1
    return found


def output_pattern(expected: str) -> re.Pattern[str]:
    """A regex for one expected output line: literal, except `…` (any text)."""
    return re.compile(".*?".join(re.escape(part) for part in expected.split("…")), re.S)


def missing_output(expected: list[str], actual: str) -> str | None:
    """None if the expected lines appear in `actual` in order (each a whole line; `...`
    skips lines), else the first expected line not found after the ones before it."""
    lines = [line for line in actual.splitlines() if line.strip()]
    at = 0
    for wanted in expected:
        if wanted in ("...", "…"):
            continue
        pattern = output_pattern(wanted)
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return wanted
        at += 1
    return None
