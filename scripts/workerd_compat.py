#!/usr/bin/env python3
"""Generate runtime/workerd-compat.json: workerd's compatibility flags and Python releases.

The local runtime (runtime/compat.mjs) compiles a Worker's compatibility date
and flags the way workerd does, builds `_cloudflare_compat_flags` from the
result, and picks the Pyodide version workerd would load. This script makes
the table it reads, from workerd's own definitions:

- `src/workerd/io/compatibility-date.capnp` (text): every flag field, its
  enable/disable flag names, enable date, `$impliedByAfterDate`,
  `$experimental` and `$pythonSnapshotRelease` annotations;
- `build/python_metadata.bzl`: which Pyodide version each Python release flag
  selects;
- optionally a workerd binary (from npm, `@cloudflare/workerd-linux-64`),
  whose compiled-in schema holds the same annotations for a newer release
  than the source snapshot. Every field the source and the binary both have
  must agree (a check of this reader); the table is then the binary's.

    python3 scripts/workerd_compat.py --workerd-git /work/.mirror/cloudflare+workerd/repo \\
        --workerd-npm 1.20261117.1

No workerd code is copied: the output is data (names, dates, versions).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
OUTPUT = PROJECT / "runtime" / "workerd-compat.json"
CAPNP_PATH = "src/workerd/io/compatibility-date.capnp"
METADATA_PATH = "build/python_metadata.bzl"

# Annotation ids declared in compatibility-date.capnp (read from the text below and checked).
ANNOTATION_NAMES = (
    "compatEnableFlag",
    "compatDisableFlag",
    "compatEnableDate",
    "compatEnableAllDates",
    "experimental",
    "impliedByAfterDate",
    "pythonSnapshotRelease",
    "neededByFl",
)
COMPATIBILITY_FLAGS_NODE_ID = 0x8F8C1B68151B6CEF  # struct CompatibilityFlags
RELEASES_CONST_NAME = b"pyodide_extra.capnp:releases"


@dataclass
class Flag:
    """One field of workerd's CompatibilityFlags struct."""

    field: str
    ordinal: int
    enable: str | None = None
    disable: str | None = None
    date: str | None = None
    all_dates: bool = False
    experimental: bool = False
    python_release: bool = False
    implied_by: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "ordinal": self.ordinal}
        for key in ("enable", "disable", "date"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.all_dates:
            out["allDates"] = True
        if self.experimental:
            out["experimental"] = True
        if self.python_release:
            out["pythonRelease"] = True
        if self.implied_by:
            out["impliedBy"] = self.implied_by
        return out


# --- the capnp text ---


def read_source(workerd_git: Path | None, path: str, file: Path | None) -> tuple[str, str]:
    """(text, where it came from): a file, or HEAD of a git dir (the mirror has no work tree)."""
    if file is not None:
        return file.read_text(), str(file)
    if workerd_git is None:
        raise SystemExit(f"workerd_compat: need --workerd-git or a file for {path}")
    text = subprocess.run(
        ["git", "-C", str(workerd_git), "show", f"HEAD:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commit = subprocess.run(
        ["git", "-C", str(workerd_git), "log", "-1", "--format=%H %cs"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return text, f"cloudflare/workerd@{commit[0]} ({commit[1]}) {path}"


def _strip_comments(text: str) -> str:
    # `#` starts a comment; no string in this file contains one (checked below).
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def _annotation_ids(text: str) -> dict[str, int]:
    ids = {
        name: int(value, 16)
        for name, value in re.findall(r"annotation\s+(\w+)\s+@(0x[0-9a-f]+)", text)
    }
    missing = [name for name in ANNOTATION_NAMES if name not in ids]
    if missing:
        raise SystemExit(f"workerd_compat: annotations not declared in the capnp text: {missing}")
    return ids


def parse_capnp(text: str) -> tuple[list[Flag], dict[str, int]]:
    """Every Bool field of `struct CompatibilityFlags` with its annotations."""
    if re.search(r'"[^"\n]*#', text):
        raise SystemExit("workerd_compat: a string holds '#'; the comment stripper would cut it")
    ids = _annotation_ids(text)
    body = re.search(r"struct CompatibilityFlags @0x[0-9a-f]+ \{(.*)\n\}", text, re.S)
    if body is None:
        raise SystemExit("workerd_compat: no struct CompatibilityFlags in the capnp text")
    flags: list[Flag] = []
    for statement in _strip_comments(body.group(1)).split(";"):
        statement = statement.strip()
        if not statement or statement.startswith("annotation "):
            continue
        head = re.match(r"(\w+)\s*@(\d+)\s*:\s*(\w+)(.*)$", statement, re.S)
        if head is None:
            raise SystemExit(f"workerd_compat: cannot read the field {statement[:80]!r}")
        name, ordinal, kind, rest = head.groups()
        if kind != "Bool":
            raise SystemExit(f"workerd_compat: {name} is {kind}, not Bool")
        flag = Flag(field=name, ordinal=int(ordinal))
        for annotation, argument in re.findall(r"\$(\w+)(?:\s*\(([^)]*)\))?", rest):
            _apply_annotation(flag, annotation, argument)
        flags.append(flag)
    return flags, ids


def _apply_annotation(flag: Flag, annotation: str, argument: str) -> None:
    value = argument.strip()
    if annotation == "compatEnableFlag":
        flag.enable = json.loads(value)
    elif annotation == "compatDisableFlag":
        flag.disable = json.loads(value)
    elif annotation == "compatEnableDate":
        flag.date = json.loads(value)
    elif annotation == "compatEnableAllDates":
        flag.all_dates = True
    elif annotation == "experimental":
        flag.experimental = True
    elif annotation == "pythonSnapshotRelease":
        flag.python_release = True
    elif annotation == "impliedByAfterDate":
        names = re.search(r"names\s*=\s*\[([^\]]*)\]", value)
        name = re.search(r'\bname\s*=\s*("[^"]*")', value)
        date = re.search(r'date\s*=\s*("[^"]*")', value)
        if date is None or (names is None and name is None):
            raise SystemExit(f"workerd_compat: cannot read $impliedByAfterDate({value})")
        if names is not None:
            listed = re.findall(r'"([^"]*)"', names.group(1))
        else:
            assert name is not None
            listed = [json.loads(name.group(1))]
        flag.implied_by.append({"names": listed, "date": json.loads(date.group(1))})
    elif annotation != "neededByFl":
        raise SystemExit(f"workerd_compat: unknown annotation ${annotation} on {flag.field}")


def parse_python_metadata(text: str) -> dict[str, str]:
    """Release flag field (camelCase) -> Pyodide version, from BUNDLE_VERSION_INFO."""
    start = text.index("BUNDLE_VERSION_INFO")
    releases: dict[str, str] = {}
    entries = r'"pyodide_version":\s*"([^"]+)"(.*?)"flag":\s*"(\w+)"'
    for entry in re.finditer(entries, text[start:], re.S):
        version, _between, flag = entry.groups()
        if version != "dev":
            releases[flag] = version
    return releases


# --- a workerd binary: its compiled-in capnp schema ---


class Message:
    """Just enough of the capnp wire format to read schema nodes embedded in a binary."""

    def __init__(self, data: bytes, base: int) -> None:
        self.data = data
        self.base = base  # byte offset of word 0 (the root pointer)

    def word(self, index: int) -> int:
        value: int = struct.unpack_from("<Q", self.data, self.base + 8 * index)[0]
        return value

    def pointer(self, index: int) -> tuple[int, int, int, int] | None:
        """(kind, target word, a, b): struct -> (data words, pointers); list -> (size, count)."""
        w = self.word(index)
        if w == 0:
            return None
        kind = w & 3
        offset = (w & 0xFFFFFFFF) >> 2
        if offset >= 1 << 29:
            offset -= 1 << 30
        target = index + 1 + offset
        if kind == 0:
            return (0, target, (w >> 32) & 0xFFFF, (w >> 48) & 0xFFFF)
        if kind == 1:
            return (1, target, (w >> 32) & 7, w >> 35)
        raise ValueError(f"unsupported capnp pointer kind {kind} at word {index}")

    def struct_at(self, index: int) -> Struct | None:
        p = self.pointer(index)
        if p is None:
            return None
        kind, target, data_words, pointers = p
        if kind != 0:
            raise ValueError(f"expected a struct pointer at word {index}")
        return Struct(self, target, data_words, pointers)

    def text_at(self, index: int) -> str:
        p = self.pointer(index)
        if p is None:
            return ""
        kind, target, size, count = p
        if kind != 1 or size != 2:
            raise ValueError(f"expected a text pointer at word {index}")
        start = self.base + 8 * target
        return self.data[start : start + count - 1].decode()

    def structs_at(self, index: int) -> list[Struct]:
        p = self.pointer(index)
        if p is None:
            return []
        kind, target, size, _words = p
        if kind != 1 or size != 7:
            raise ValueError(f"expected a composite list at word {index}")
        tag = self.word(target)
        count = (tag & 0xFFFFFFFF) >> 2
        data_words, pointers = (tag >> 32) & 0xFFFF, (tag >> 48) & 0xFFFF
        step = data_words + pointers
        return [Struct(self, target + 1 + i * step, data_words, pointers) for i in range(count)]

    def texts_at(self, index: int) -> list[str]:
        p = self.pointer(index)
        if p is None:
            return []
        kind, target, size, count = p
        if kind != 1 or size != 6:
            raise ValueError(f"expected a list of pointers at word {index}")
        return [self.text_at(target + i) for i in range(count)]


@dataclass
class Struct:
    message: Message
    start: int
    data_words: int
    pointers: int

    def uint(self, byte_offset: int, size: int) -> int:
        if byte_offset + size > 8 * self.data_words:
            return 0
        at = self.message.base + 8 * self.start + byte_offset
        return int.from_bytes(self.message.data[at : at + size], "little")

    def pointer_index(self, n: int) -> int:
        return self.start + self.data_words + n

    def text(self, n: int) -> str:
        return self.message.text_at(self.pointer_index(n)) if n < self.pointers else ""

    def struct(self, n: int) -> Struct | None:
        return self.message.struct_at(self.pointer_index(n)) if n < self.pointers else None

    def structs(self, n: int) -> list[Struct]:
        return self.message.structs_at(self.pointer_index(n)) if n < self.pointers else []

    def texts(self, n: int) -> list[str]:
        return self.message.texts_at(self.pointer_index(n)) if n < self.pointers else []


# schema.capnp layouts (Node, Field, Annotation, Value) by byte offset / pointer index.
NODE_STRUCT, NODE_CONST = 1, 4
VALUE_VOID, VALUE_TEXT, VALUE_LIST, VALUE_STRUCT = 0, 12, 14, 16


def _node_at(data: bytes, root: int) -> Struct | None:
    try:
        return Message(data, root).struct_at(0)
    except (ValueError, struct.error):
        return None


def find_flags_node(data: bytes) -> Struct:
    needle = struct.pack("<Q", COMPATIBILITY_FLAGS_NODE_ID)
    at = data.find(needle)
    while at != -1:
        node = _node_at(data, at - 8) if at % 8 == 0 else None
        if node and node.start == 1 and node.uint(12, 2) == NODE_STRUCT:
            return node
        at = data.find(needle, at + 1)
    raise SystemExit("workerd_compat: the CompatibilityFlags schema node is not in the binary")


def find_node_named(data: bytes, suffix: bytes) -> Struct:
    at = data.find(suffix + b"\0")
    while at != -1:
        for back in range(8, 4096, 8):
            root = (at - back) & ~7
            node = _node_at(data, root)
            if node is None or node.start != 1 or node.pointers < 5:
                continue
            try:
                if node.text(0).encode().endswith(suffix):
                    return node
            except (ValueError, UnicodeDecodeError, struct.error):
                continue
        at = data.find(suffix + b"\0", at + 1)
    raise SystemExit(f"workerd_compat: no schema node named *{suffix.decode()} in the binary")


def parse_binary(data: bytes, ids: dict[str, int]) -> tuple[list[Flag], dict[str, str]]:
    by_id = {value: name for name, value in ids.items()}
    node = find_flags_node(data)
    flags: list[Flag] = []
    for f in node.structs(3):
        # Field: name ptr0, annotations ptr1; ordinal: union tag at byte 10, explicit at byte 12.
        if f.uint(10, 2) != 1:
            raise SystemExit(f"workerd_compat: field {f.text(0)} has no explicit ordinal")
        flag = Flag(field=f.text(0), ordinal=f.uint(12, 2))
        for annotation in f.structs(1):
            name = by_id.get(annotation.uint(0, 8))
            if name is None:
                raise SystemExit(f"workerd_compat: unknown annotation on {flag.field}")
            value = annotation.struct(0)
            kind = value.uint(0, 2) if value else VALUE_VOID
            if kind == VALUE_TEXT and value is not None:
                _apply_annotation(flag, name, json.dumps(value.text(0)))
            elif kind == VALUE_STRUCT and value is not None and name == "impliedByAfterDate":
                implied = value.struct(0)
                if implied is None:
                    raise SystemExit(f"workerd_compat: empty $impliedByAfterDate on {flag.field}")
                names = [implied.text(0)] if implied.uint(0, 2) == 0 else implied.texts(0)
                flag.implied_by.append({"names": names, "date": implied.text(1)})
            elif kind == VALUE_VOID:
                _apply_annotation(flag, name, "")
            else:
                raise SystemExit(f"workerd_compat: unexpected value kind {kind} for ${name}")
        flags.append(flag)

    # const releases :List(PythonSnapshotRelease): Node.const.value is pointer 4.
    const = find_node_named(data, RELEASES_CONST_NAME)
    if const.uint(12, 2) != NODE_CONST:
        raise SystemExit("workerd_compat: the releases node is not a const")
    value = const.struct(4)
    if value is None or value.uint(0, 2) != VALUE_LIST:
        raise SystemExit("workerd_compat: the releases const is not a list")
    releases: dict[str, str] = {}
    for release in value.structs(0):
        # PythonSnapshotRelease: pyodide ptr0, fieldName ptr4, flagName ptr5.
        flag_name = release.text(5) or release.text(4)
        if release.text(0) != "dev":
            releases.setdefault(flag_name, release.text(0))
    return sorted(flags, key=lambda f: f.ordinal), releases


def npm_workerd_binary(version: str, into: Path) -> Path:
    """`npm pack @cloudflare/workerd-linux-64@version` and unpack its bin/workerd."""
    package = f"@cloudflare/workerd-linux-64@{version}"
    result = subprocess.run(
        ["npm", "pack", package, "--silent"], cwd=into, capture_output=True, text=True, check=True
    )
    tarball = into / result.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as archive:
        archive.extract("package/bin/workerd", into, filter="data")
    return into / "package" / "bin" / "workerd"


# --- output ---


def compare(source: list[Flag], binary: list[Flag]) -> tuple[list[str], list[str]]:
    """(problems, changes) between the source snapshot and a newer binary.

    workerd never reuses an ordinal nor renames a released flag, so a field of
    the source must be in the binary under the same ordinal, name, enable and
    disable flag names (else this reader is wrong: a problem), unless it was
    experimental. A date, an implication or the experimental mark may have
    changed since (a change, reported).
    """
    by_ordinal = {f.ordinal: f for f in binary}
    problems, changes = [], []
    for flag in source:
        other = by_ordinal.get(flag.ordinal)
        same_names = other is not None and (other.field, other.enable, other.disable) == (
            flag.field,
            flag.enable,
            flag.disable,
        )
        if not same_names:
            seen = other.as_json() if other else None
            line = f"@{flag.ordinal}: source {flag.as_json()}, binary {seen}"
            (changes if flag.experimental else problems).append(line)
        elif other != flag:
            changes.append(f"{flag.field}: source {flag.as_json()}, binary {other.as_json()}")
    return problems, changes


def render(flags: list[Flag], releases: dict[str, str], sources: list[str]) -> str:
    lines = [
        "{",
        '  "generatedBy": "scripts/workerd_compat.py",',
        f'  "sources": {json.dumps(sources)},',
        f'  "pythonReleases": {json.dumps(releases, sort_keys=True)},',
        '  "flags": [',
    ]
    rows = [f"    {json.dumps(flag.as_json())}" for flag in flags]
    lines.append(",\n".join(rows))
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workerd-git", type=Path, help="a git dir of cloudflare/workerd")
    parser.add_argument("--capnp", type=Path, help=f"{CAPNP_PATH} as a file")
    parser.add_argument("--python-metadata", type=Path, help=f"{METADATA_PATH} as a file")
    parser.add_argument("--workerd-binary", type=Path, help="a workerd executable")
    parser.add_argument("--workerd-npm", metavar="VERSION", help="fetch workerd VERSION from npm")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)

    capnp_text, capnp_source = read_source(args.workerd_git, CAPNP_PATH, args.capnp)
    bzl_text, bzl_source = read_source(args.workerd_git, METADATA_PATH, args.python_metadata)
    flags, ids = parse_capnp(capnp_text)
    releases = parse_python_metadata(bzl_text)
    sources = [capnp_source, bzl_source]

    binary_path: Path | None = args.workerd_binary
    with tempfile.TemporaryDirectory() as scratch:
        if args.workerd_npm:
            binary_path = npm_workerd_binary(args.workerd_npm, Path(scratch))
        if binary_path is not None:
            binary_flags, binary_releases = parse_binary(binary_path.read_bytes(), ids)
            problems, changes = compare(flags, binary_flags)
            if problems:
                listed = "\n".join(problems)
                raise SystemExit(f"workerd_compat: source and binary disagree:\n{listed}")
            print(
                f"workerd_compat: source has {len(flags)} flags, binary {len(binary_flags)}; "
                f"{len(flags) - len(changes)} identical, changed since the source:"
            )
            for change in changes:
                print(f"  {change}")
            flags, releases = binary_flags, binary_releases
            label = str(binary_path)
            if args.workerd_npm:
                label = f"npm @cloudflare/workerd-linux-64@{args.workerd_npm}"
            sources.append(f"{label}: compiled-in flags schema and Python releases (used)")

    known = {f.field for f in flags}
    for release_field in releases:
        if release_field not in known:
            raise SystemExit(f"workerd_compat: release flag {release_field} is not a field")
    args.output.write_text(render(flags, releases, sources))
    print(f"workerd_compat: wrote {len(flags)} flags, {len(releases)} releases to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
