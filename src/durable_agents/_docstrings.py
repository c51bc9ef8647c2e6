"""What a tool function's docstring tells the model: the tool's description and each
argument's, for `@tool` on a function with plain parameters (docs/python-api.md, "Tools").

Read as pydantic-ai reads a tool's docstring, so the same function is described the same
way by both: the style (Google, NumPy or Sphinx) guessed from the text; the argument
sections give the arguments' descriptions and leave the tool's; a returns section is
added as `<summary>...</summary><returns>...</returns>`; notes and other admonitions stay,
written as `Note:` and their text; raises, examples and the like are left out.
pydantic-ai uses griffe for this; the Worker has no griffe, so this is a small reader
of its own (stdlib only).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

_PARAMETER_SECTIONS = {
    "args",
    "arguments",
    "params",
    "parameters",
    "keyword args",
    "keyword arguments",
    "other args",
    "other arguments",
    "other params",
    "other parameters",
}
# Sections that say nothing the model reads: left out of the description.
_LEFT_OUT = {
    "type args",
    "type arguments",
    "type params",
    "type parameters",
    "raises",
    "exceptions",
    "yields",
    "receives",
    "examples",
    "attributes",
    "functions",
    "methods",
    "classes",
    "type aliases",
    "modules",
    "warns",
}
_NUMPY_LEFT_OUT = {
    "raises",
    "yields",
    "receives",
    "warns",
    "examples",
    "attributes",
    "methods",
    "functions",
    "classes",
    "modules",
    "deprecated",
}

_SPHINX_FIELDS = (
    "param|parameter|arg|argument|key|keyword|type|var|ivar|cvar|vartype|returns|return|rtype"
    "|raises|raise|except|exception"
)
_GOOGLE_GUESS = (
    "args|arguments|params|parameters|keyword args|keyword arguments|other args|"
    "other arguments|other params|other parameters|raises|exceptions|returns|yields|"
    "receives|examples|attributes|functions|methods|classes|modules|warns|warnings"
)
_NUMPY_GUESS = (
    "deprecated|parameters|other parameters|returns|yields|receives|raises|warns|"
    "attributes|functions|methods|classes|modules"
)
# Each guess looks past the first line and wants the line after the marker, as
# pydantic-ai's guess does (a Sphinx field on a docstring's last line does not count).
_STYLES = (
    ("sphinx", re.compile(rf"\n[ \t]*:(?:{_SPHINX_FIELDS})(?:[ \t]+\w+)*:(?:[ \t]+.+)?\n", re.I)),
    ("google", re.compile(rf"\n[ \t]*(?:{_GOOGLE_GUESS}):(?:[ \t]+.+)?\n[ \t]+.+", re.I)),
    ("numpy", re.compile(rf"\n[ \t]*(?:{_NUMPY_GUESS})\n[ \t]*---+\n", re.I)),
)

_GOOGLE_HEADER = re.compile(r"^(?P<kind>\w[\w\s-]*):(?:\s+(?P<title>\S.*?))?\s*$")
_GOOGLE_ITEM = re.compile(r"^\**(?P<name>\w+)\s*(?:\((?P<type>.+)\))?\s*:\s*(?P<text>.*)$")
_NUMPY_NAME = re.compile(r"\**\w+")
_SPHINX_FIELD = re.compile(r"^:(?P<kind>\w+)(?P<words>(?:\s+[^:\s]+)*)\s*:\s*(?P<text>.*)$")


@dataclass
class _Reading:
    """What the docstring said, as it is read."""

    parts: list[str] = field(default_factory=list)  # the description's paragraphs
    arguments: dict[str, str] = field(default_factory=dict)
    returns: tuple[str | None, str] | None = None  # (type, description)

    def text(self, lines: list[str]) -> None:
        while lines and not lines[0].strip():
            lines = lines[1:]
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        if lines:
            self.parts.append("\n".join(lines))

    def argument(self, name: str, text: str) -> None:
        self.arguments.setdefault(name.lstrip("*"), text)

    def description(self) -> str:
        main = "\n\n".join(self.parts)
        if self.returns is None:
            return main
        kind, text = self.returns
        kind_tag = f"<type>{kind}</type>\n" if kind else ""
        said = f"<returns>\n{kind_tag}<description>{text}</description>\n</returns>"
        return f"<summary>{main}</summary>\n{said}" if main else said


def describe(doc: str | None, *, has_return_annotation: bool) -> tuple[str | None, dict[str, str]]:
    """The tool's description and its arguments' descriptions (by parameter name), read
    from `doc`; `(None, {})` without one. `has_return_annotation`: the function declares
    what it returns, so a Google returns section is all description (no type before a
    colon)."""
    if doc is None:
        return None, {}
    style = next((name for name, guess in _STYLES if guess.search(doc)), "google")
    lines = inspect.cleandoc(doc.rstrip()).splitlines()
    reading = _Reading()
    readers: dict[str, Callable[[list[str], _Reading, bool], None]] = {
        "google": _read_google,
        "numpy": _read_numpy,
        "sphinx": _read_sphinx,
    }
    readers[style](lines, reading, has_return_annotation)
    return reading.description(), reading.arguments


def _dedent(lines: list[str]) -> list[str]:
    return textwrap.dedent("\n".join(lines)).split("\n") if lines else []


def _trim_end(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


# Google ------------------------------------------------------------------------------


def _google_block(lines: list[str], start: int) -> list[str]:
    """The indented lines from `start` (as far as they keep the first one's indent),
    dedented by that indent."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    block: list[str] = []
    for line in lines[start:]:
        if line.strip() and not line.startswith(" " * indent):
            break
        block.append(line[indent:])
    return block


def _is_google_section(lines: list[str], i: int) -> bool:
    above_blank = i == 0 or not lines[i - 1].strip()
    below = lines[i + 1] if i + 1 < len(lines) else ""
    return above_blank and bool(below.strip()) and below.startswith(" ")


def _read_google(lines: list[str], reading: _Reading, has_return_annotation: bool) -> None:
    text: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip(" ").startswith("```"):
            fenced = not fenced
        header = None if fenced else _GOOGLE_HEADER.match(line)
        if header is None or not _is_google_section(lines, i):
            text.append(line)
            i += 1
            continue
        block = _google_block(lines, i + 1)
        i += 1 + len(block)
        reading.text(text)
        text = []
        _google_section(line, header, _trim_end(block), reading, has_return_annotation)
    reading.text(text)


def _google_section(
    line: str,
    header: re.Match[str],
    block: list[str],
    reading: _Reading,
    has_return_annotation: bool,
) -> None:
    kind, title = header["kind"].strip(), header["title"]
    said = kind.lower()
    if said in _PARAMETER_SECTIONS:
        _google_arguments(block, reading)
    elif said == "returns":
        if reading.returns is None:
            reading.returns = _google_returns(block, has_return_annotation)
    elif said == "warnings":
        reading.parts.append(f"{line.rstrip()}\n" + "\n".join(block))
    elif said not in _LEFT_OUT:  # an admonition: `Note:`, `Warning: title`, ...
        named = re.sub(r"\s+", "-", said)
        if title is None or title.lower().replace(" ", "-") == named:
            written = f"{title or kind}:"
        else:
            written = f"{named.replace('-', ' ').capitalize()}: {title}"
        reading.parts.append(f"{written}\n" + "\n".join(block))


def _google_arguments(block: list[str], reading: _Reading) -> None:
    items: list[list[str]] = []
    for line in block:
        if line.strip() and not line.startswith(" "):
            items.append([line])
        elif items:
            items[-1].append(line)
    for first, *more in items:
        item = _GOOGLE_ITEM.match(first)
        if item is None:
            continue
        rest = _dedent(_trim_end(more))
        reading.argument(item["name"], "\n".join([item["text"].strip(), *rest]))


def _google_returns(block: list[str], has_return_annotation: bool) -> tuple[str | None, str]:
    written = "\n".join(block)
    first = block[0] if block else ""
    if has_return_annotation or ":" not in first:
        return None, written
    kind, _, text = written.partition(":")
    kind = kind.strip()
    if kind.startswith("(") and kind.endswith(")"):
        kind = kind[1:-1].strip()
    return kind or None, text.strip()


# NumPy -------------------------------------------------------------------------------


def _numpy_headers(lines: list[str]) -> list[int]:
    return [
        i for i in range(len(lines) - 1) if lines[i].strip() and set(lines[i + 1].strip()) == {"-"}
    ]


def _read_numpy(lines: list[str], reading: _Reading, has_return_annotation: bool) -> None:
    headers = _numpy_headers(lines)
    reading.text(lines[: headers[0]] if headers else lines)
    for n, start in enumerate(headers):
        end = headers[n + 1] if n + 1 < len(headers) else len(lines)
        title = lines[start].strip()
        block = _trim_end(_dedent(lines[start + 2 : end]))
        while block and not block[0].strip():
            block = block[1:]
        said = title.lower()
        if said in ("parameters", "other parameters"):
            for first, text in _numpy_items(block):
                for name in first.partition(" : ")[0].split(","):
                    if named := _NUMPY_NAME.match(name.strip()):
                        reading.argument(named[0], text)
        elif said == "returns":
            items = _numpy_items(block)
            if items and reading.returns is None:  # `type`, or `name : type`
                first, text = items[0]
                kind = first.partition(" : ")[2] if " : " in first else first
                reading.returns = (kind.strip() or None, text)
        elif said not in _NUMPY_LEFT_OUT:
            reading.parts.append(f"{title}:\n" + "\n".join(block))


def _numpy_items(block: list[str]) -> list[tuple[str, str]]:
    """Each item of a section: its first line and its indented text."""
    items: list[tuple[str, list[str]]] = []
    for line in block:
        if line.strip() and not line.startswith(" "):
            items.append((line.strip(), []))
        elif items:
            items[-1][1].append(line)
    return [(first, "\n".join(_dedent(_trim_end(more)))) for first, more in items]


# Sphinx ------------------------------------------------------------------------------


def _read_sphinx(lines: list[str], reading: _Reading, has_return_annotation: bool) -> None:
    starts = [i for i, line in enumerate(lines) if _SPHINX_FIELD.match(line)]
    reading.text(lines[: starts[0]] if starts else lines)
    returns: str | None = None
    returns_type: str | None = None
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        found = _SPHINX_FIELD.match(lines[start])
        assert found is not None
        more = _dedent(_trim_end(lines[start + 1 : end]))
        text = "\n".join([found["text"].strip(), *more]).strip()
        kind, words = found["kind"].lower(), found["words"].split()
        if kind in ("param", "parameter", "arg", "argument", "key", "keyword") and words:
            reading.argument(words[-1], text)
        elif kind in ("returns", "return") and returns is None:
            returns = text
        elif kind == "rtype" and returns_type is None:
            returns_type = text
    if returns is not None:
        reading.returns = (returns_type, returns)
