#!/usr/bin/env python3
"""The Worker's Python packages: Pyodide wheels, pinned, vendored into python_modules/.

Why this exists: `pywrangler sync` resolves against a Pyodide package index
that is unreachable offline, but the same wheels are on PyPI (native ones under
the `pyemscripten_2026_0_wasm32` platform tag). This script builds the folder
`pywrangler` would make: every wheel of the lock unpacked side by side in
`python_modules/`. The local runtime (runtime/) mounts it on `sys.path`, and a
deploy uploads it.

    python3 scripts/vendor.py                 # install what scripts/pyodide-lock.txt pins
    python3 scripts/vendor.py --relock        # re-resolve every pin afresh
    scripts/add-package NAME[SPEC] ...        # runs `python3 scripts/vendor.py add ...`

The lock pins every wheel (transitive ones too) so the vendored pydantic-core
is exactly the one the vendored pydantic was built against. `add` puts a
requirement in `[project].dependencies` and resolves for CPython 3.14 on
Pyodide with every existing pin as a constraint (a pin moves only when the new
package needs another version of it); it refuses, changing nothing, when a
package of that resolution has no wheel Pyodide can load. `--relock`
re-resolves `[project].dependencies` plus `workers-runtime-sdk` without
constraints. Both print what the lock gained, changed and lost. Wheels are
cached in `.cache/wheels/` under their name and version: a cached wheel of
another version never stands in for a pin. `python_modules/.vendor-stamp`
holds a hash of the pins: when it matches, the script does nothing (a running
`scripts/dev` watches that file and reloads the Worker when it changes).

The guide: docs/packages.md. Plain python3 (stdlib only) and pip.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
LOCK = PROJECT / "scripts" / "pyodide-lock.txt"
CACHE = PROJECT / ".cache" / "wheels"
TARGET = PROJECT / "python_modules"
STAMP = TARGET / ".vendor-stamp"
PYPROJECT = PROJECT / "pyproject.toml"
VENV_PYTHON = PROJECT / ".venv" / "bin" / "python"
# scripts/setup-python's record that .venv matches pyproject.toml: "<sha256 of it> <folder>".
VENV_STAMP = PROJECT / ".venv" / ".installed-stamp"

# The Pyodide that Cloudflare runs for `python_workers` with a compatibility date
# from 2026-09-08 (`python_workers_314`, Pyodide 314.0.6): CPython 3.14, wheel ABI
# 2026_0, shared by every Pyodide 314.x. check_pyodide_abi() compares this with the
# npm `pyodide` that package.json pins.
ABI = "2026_0"
PYTHON = "3.14"
PLATFORM = f"pyemscripten_{ABI}_wasm32"
PLATFORM_ARGS = (
    "--platform",
    PLATFORM,
    "--python-version",
    PYTHON,
    "--implementation",
    "cp",
    "--only-binary=:all:",
)
# Provided by the Workers runtime in production; a deploy vendors it too.
RUNTIME_REQUIREMENTS = ("workers-runtime-sdk",)
# Bump when the layout of python_modules/ changes, to force a rebuild.
LAYOUT_VERSION = "1"
DEFAULT_INDEX = "https://pypi.org/simple"
LOCK_HEADER = (
    "# The Worker's Python packages: every wheel python_modules/ holds, pinned (transitive",
    "# ones too), for CPython 3.14 on Pyodide. Written by scripts/vendor.py, not by hand:",
    "# `scripts/add-package NAME` adds a package (to pyproject.toml's [project].dependencies,",
    "# this lock, python_modules/ and .venv) keeping every other pin; `python3",
    "# scripts/vendor.py --relock` re-resolves the dependencies plus workers-runtime-sdk",
    "# afresh. Both print what changed. The guide: docs/packages.md.",
)
# How many times a resolution may set pins free that the new packages conflict with.
MAX_RELAXED_ROUNDS = 5
# pip's words for a constraint in a conflict, and for a package it found no file for.
_CONSTRAINT_CONFLICT = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)")
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)(?: \(from ([^)]*)\))?")
_VERSIONS = re.compile(
    r"satisfies the requirement (\S+)(?: \(from [^)]*\))? \(from versions: ([^)]*)\)"
)
_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*"
    r"(?:\[(?P<extras>[^\]]*)\])?\s*(?P<spec>[^;@]*?)\s*(?:;\s*(?P<marker>.+?))?\s*$"
)
_CLAUSE = r"(~=|===|==|!=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+"
_SPEC = re.compile(rf"^{_CLAUSE}(,{_CLAUSE})*$")  # spaces removed first


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements() -> list[str]:
    data = tomllib.loads(PYPROJECT.read_text())
    return [*data["project"]["dependencies"], *RUNTIME_REQUIREMENTS]


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise SystemExit(f"vendor: cannot read a package name from {requirement!r}")
    return normalize(match.group(1))


# -- wheels and the cache ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wheel:
    """A wheel file by what its name says: the package (normalized), version, platforms."""

    name: str
    version: str
    platforms: tuple[str, ...]
    path: Path

    @property
    def fits_pyodide(self) -> bool:
        """Pure Python (`any`), or built for the Pyodide the Worker runs."""
        return any(platform in ("any", PLATFORM) for platform in self.platforms)


def wheel_of(path: Path) -> Wheel | None:
    """The wheel `path` names ({name}-{version}[-{build}]-{python}-{abi}-{platform}.whl)."""
    parts = path.name.removesuffix(".whl").split("-")
    if not path.name.endswith(".whl") or len(parts) not in (5, 6):
        return None
    return Wheel(normalize(parts[0]), parts[1], tuple(parts[-1].split(".")), path)


def wheels_in(folder: Path) -> dict[str, Wheel]:
    """The Pyodide wheels of `folder` by package (one resolution: one version each)."""
    found: dict[str, Wheel] = {}
    for path in sorted(folder.glob("*.whl")):
        wheel = wheel_of(path)
        if wheel is not None and wheel.fits_pyodide:
            found[wheel.name] = wheel
    return found


def cached_wheels(pins: dict[str, str]) -> dict[str, Path]:
    """The cached wheel of each pin: its name and version exactly (another version of
    the same package in the cache is not it)."""
    found: dict[str, Path] = {}
    for path in sorted(CACHE.glob("*.whl")) if CACHE.is_dir() else []:
        wheel = wheel_of(path)
        if wheel is not None and wheel.fits_pyodide and pins.get(wheel.name) == wheel.version:
            found.setdefault(wheel.name, path)
    return found


def cache(wheels: dict[str, Wheel]) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    for wheel in wheels.values():
        if not (CACHE / wheel.path.name).is_file():
            shutil.copy2(wheel.path, CACHE / wheel.path.name)


# -- the lock -----------------------------------------------------------------------------


def read_lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[normalize(name)] = version.strip()
    return pins


def write_lock(pins: dict[str, str]) -> None:
    lines = [*LOCK_HEADER, *(f"{name}=={version}" for name, version in sorted(pins.items()))]
    LOCK.write_text("\n".join(lines) + "\n")


def lock_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What the lock gained (`+ name version`), changed (`name old -> new`) and lost
    (`- name version`), by package name."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        if name not in old:
            lines.append(f"+ {name} {new[name]}")
        elif name not in new:
            lines.append(f"- {name} {old[name]}")
        elif old[name] != new[name]:
            lines.append(f"{name} {old[name]} -> {new[name]}")
    return lines


def print_changes(prog: str, old: dict[str, str], new: dict[str, str]) -> None:
    changes = lock_changes(old, new)
    where = LOCK.relative_to(PROJECT)
    if not changes:
        print(f"{prog}: {where} is unchanged ({len(new)} wheels)")
        return
    print(f"{prog}: {where} changed ({len(new)} wheels):")
    for line in changes:
        print(f"  {line}")


# -- resolving for Pyodide ------------------------------------------------------------------


class Refused(Exception):
    """The packages cannot be resolved for the Worker; the message says which and why."""


def run_pip(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def pip(*args: str) -> None:
    result = run_pip(*args)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"vendor: pip failed: pip {' '.join(args)}")


def resolve(
    requirements: list[str], keep: dict[str, str], scratch: Path, index_url: str | None = None
) -> dict[str, Wheel]:
    """The Pyodide wheels of `requirements` and all they need, downloaded into `scratch`,
    with `keep`'s pins as constraints: a pin the requirements conflict with (pip names it)
    is set free and the resolution tried again. Refused for what cannot be resolved."""
    index = ["--index-url", index_url] if index_url else []
    relaxed: set[str] = set()
    for attempt in range(MAX_RELAXED_ROUNDS + 1):
        dest = scratch / f"resolution-{attempt}"
        constraints = scratch / f"constraints-{attempt}.txt"
        constraints.write_text(
            "".join(f"{n}=={v}\n" for n, v in sorted(keep.items()) if n not in relaxed)
        )
        result = run_pip(
            "download", "--dest", str(dest), *PLATFORM_ARGS, *index,
            "--constraint", str(constraints), *requirements,
        )  # fmt: skip
        if result.returncode == 0:
            return wheels_in(dest)
        output = result.stdout + result.stderr
        conflicting = {normalize(n) for n in _CONSTRAINT_CONFLICT.findall(output)} - relaxed
        if not conflicting:
            raise Refused(resolution_failure(output, index_url))
        relaxed |= conflicting
    raise Refused(f"pip found no resolution keeping the pins it could keep ({sorted(relaxed)})")


def resolution_failure(output: str, index_url: str | None) -> str:
    """Why pip resolved nothing, said for the Worker: the package (and what needs it) that
    has no wheel Pyodide loads, and what the index has of it instead."""
    match = _NO_MATCH.search(output)
    if match is None:
        tail = "\n".join(line for line in output.splitlines()[-15:] if line.strip())
        return f"pip could not resolve the packages for the Worker:\n{tail}"
    requirement, needed_by = match.group(1), match.group(2)
    name = requirement_name(requirement)
    versions = next((v for r, v in _VERSIONS.findall(output) if r == requirement), "none")
    who = name + (f" (needed by {needed_by})" if needed_by else "")
    if versions.strip() not in ("", "none"):
        return (
            f"{who}: no version with a wheel the Worker can load matches {requirement} "
            f"(those with one: {versions})"
        )
    built = pyodide_builds(name)
    pyodide = (
        f" (Pyodide's own distribution builds {name} {built}, but not on the package index, "
        "where this script takes wheels from)"
        if built
        else ""
    )
    return (
        f"{who} has no wheel the Worker can load: {why_no_wheel(name, index_url)}{pyodide}. "
        f"The Worker runs CPython {PYTHON} on Pyodide (WebAssembly): it loads pure-Python "
        f"wheels (py3-none-any) and wheels built for Pyodide ({PLATFORM}), never a source "
        "distribution or a native wheel for another platform"
    )


def why_no_wheel(name: str, index_url: str | None) -> str:
    """What the index holds of `name`, when it can be read: sdists only, native wheels."""
    files = index_files(name, index_url or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX)
    if files is None:
        return "pip found none (the index could not be read for details)"
    wheels = [f for f in files if f.endswith(".whl")]
    sdists = [f for f in files if not f.endswith(".whl")]
    if not files:
        return "the index has no files for it"
    if not wheels:
        return f"it has only source distributions ({', '.join(sdists[-2:])})"
    platforms = sorted(
        {p for f in wheels for p in f.removesuffix(".whl").split("-")[-1].split(".")}
    )
    pyodide = [p for p in platforms if "emscripten" in p]
    if pyodide:
        return f"its wheels for Pyodide are for other versions of it ({', '.join(pyodide)})"
    families = sorted({re.sub(r"[_\d].*", "", p) or p for p in platforms})
    shown = ", ".join(platforms) if len(platforms) <= 3 else f"{', '.join(families)}: ..."
    besides = " and source distributions" if sdists else ""
    return f"it has only native wheels, for other platforms ({shown}){besides}"


def pyodide_builds(name: str) -> str | None:
    """The version of `name` that Pyodide's own distribution builds (node_modules/pyodide's
    pyodide-lock.json lists them: wheels on Pyodide's CDN, not on the package index)."""
    lock = PROJECT / "node_modules" / "pyodide" / "pyodide-lock.json"
    try:
        packages = json.loads(lock.read_text())["packages"]
    except (OSError, ValueError, KeyError):
        return None
    found = packages.get(normalize(name)) if isinstance(packages, dict) else None
    return str(found.get("version")) if isinstance(found, dict) else None


def index_files(name: str, index_url: str) -> list[str] | None:
    """The file names a PEP 503/691 simple index lists for `name`; None if unreadable."""
    url = f"{index_url.rstrip('/')}/{normalize(name)}/"
    request = urllib.request.Request(
        url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            kind = response.headers.get("content-type", "")
            body = response.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, ValueError):
        return None
    if "json" in kind:
        try:
            return [str(f["filename"]) for f in json.loads(body).get("files", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
    return [f.strip() for f in re.findall(r"<a\b[^>]*>([^<]+)</a>", body)]


# -- python_modules/ ------------------------------------------------------------------------


def check_lock_covers_requirements(pins: dict[str, str]) -> None:
    missing = [r for r in project_requirements() if requirement_name(r) not in pins]
    if missing:
        raise SystemExit(
            f"vendor: {LOCK.relative_to(PROJECT)} lacks {missing}: add them with "
            f"`scripts/add-package {' '.join(missing)}` (or re-resolve everything: "
            "`python3 scripts/vendor.py --relock`)"
        )


def fetch_locked_wheels(pins: dict[str, str]) -> dict[str, Path]:
    """The wheel file of every pin, from the cache or else from the package index."""
    found = cached_wheels(pins)
    missing = [f"{n}=={v}" for n, v in sorted(pins.items()) if n not in found]
    if missing:
        print(f"vendor: downloading {', '.join(missing)}")
        with tempfile.TemporaryDirectory() as scratch:
            pip("download", "--no-deps", "--dest", scratch, *PLATFORM_ARGS, *missing)
            cache(wheels_in(Path(scratch)))
        found = cached_wheels(pins)
        still = [n for n in pins if n not in found]
        if still:
            raise SystemExit(f"vendor: pip did not produce wheels for {still}")
    return found


def check_pyodide_abi() -> None:
    """The wheels must fit the Pyodide the local runtime runs (node_modules/pyodide)."""
    lock = PROJECT / "node_modules" / "pyodide" / "pyodide-lock.json"
    if not lock.exists():
        return  # npm ci has not run yet; the runtime checks its Pyodide when it starts
    info = json.loads(lock.read_text())["info"]
    if info.get("abi_version") != ABI or not str(info.get("python", "")).startswith(PYTHON + "."):
        raise SystemExit(
            f"vendor: node_modules/pyodide is Python {info.get('python')} with wheel ABI "
            f"{info.get('abi_version')}, but this script vendors cp{PYTHON.replace('.', '')} "
            f"wheels for ABI {ABI}; update ABI/PYTHON in scripts/vendor.py and relock"
        )


def check_pydantic_core_matches(wheels: dict[str, Path]) -> None:
    """pydantic only works with the exact pydantic-core it names; catch a bad lock early."""
    if "pydantic" not in wheels or "pydantic-core" not in wheels:
        return
    with zipfile.ZipFile(wheels["pydantic"]) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    wanted = re.search(r"^Requires-Dist: pydantic-core\s*\(?==\s*([^\s;)]+)", metadata, re.M)
    have = wheel_of(wheels["pydantic-core"])
    if wanted and have and wanted.group(1) != have.version:
        raise SystemExit(
            f"vendor: pydantic needs pydantic-core=={wanted.group(1)} but the lock pins "
            f"{have.version}; run `python3 scripts/vendor.py --relock`"
        )


def inputs_hash(pins: dict[str, str]) -> str:
    payload = json.dumps([LAYOUT_VERSION, PLATFORM_ARGS, sorted(pins.items())])
    return hashlib.sha256(payload.encode()).hexdigest()


def unpack(wheels: dict[str, Path], stamp: str) -> None:
    # Build beside the target and swap it in, so an interrupted run never
    # leaves a half-filled python_modules/ that looks complete.
    staging = TARGET.with_name(TARGET.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for path in wheels.values():
        with zipfile.ZipFile(path) as archive:
            archive.extractall(staging)
    (staging / ".vendor-stamp").write_text(stamp + "\n")
    if TARGET.is_symlink():
        TARGET.unlink()
    shutil.rmtree(TARGET, ignore_errors=True)
    staging.rename(TARGET)


def vendor(pins: dict[str, str], prog: str = "vendor") -> None:
    """python_modules/ holding exactly the wheels of `pins` (nothing done when its stamp
    says it does already)."""
    expected = inputs_hash(pins)
    # The stamp only names wheel files, so it is checked before the cache or the network.
    if STAMP.exists() and STAMP.read_text().strip() == expected:
        print(f"{prog}: python_modules/ is up to date")
        return
    wheels = fetch_locked_wheels(pins)
    check_pydantic_core_matches(wheels)
    unpack(wheels, expected)
    names = ", ".join(f"{n}=={v}" for n, v in sorted(pins.items()))
    listed = f": {names}" if prog == "vendor" else " (the lock's)"
    print(f"{prog}: unpacked {len(wheels)} wheels into python_modules/{listed}")


def relock() -> None:
    """Resolve the requirements afresh for Pyodide, write the lock, say what changed."""
    old = read_lock() if LOCK.exists() else {}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            resolved = resolve(project_requirements(), {}, Path(scratch))
        except Refused as exc:
            raise SystemExit(f"vendor: --relock: {exc}") from None
        cache(resolved)
    pins = {name: wheel.version for name, wheel in resolved.items()}
    write_lock(pins)
    print_changes("vendor", old, pins)


# -- adding a package -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requirement:
    """A requirement as pyproject.toml writes it: `name[extras] spec; marker`."""

    name: str
    extras: tuple[str, ...] = ()
    spec: str = ""
    marker: str = ""

    @property
    def key(self) -> str:
        return normalize(self.name)

    def __str__(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        marker = f"; {self.marker}" if self.marker else ""
        return f"{self.name}{extras}{self.spec}{marker}"

    def merged(self, new: Requirement) -> Requirement:
        """This requirement with `new`'s extras added, and its version spec and marker
        where `new` gives them."""
        extras = tuple(sorted({*self.extras, *new.extras}, key=normalize))
        return Requirement(self.name, extras, new.spec or self.spec, new.marker or self.marker)


def parse_requirement(text: str) -> Requirement:
    """`text` as a Requirement; ValueError saying what form is expected."""
    match = _REQUIREMENT.match(text)
    spec = (match.group("spec") or "").replace(" ", "") if match else ""
    if match is None or "@" in text or (spec and not _SPEC.match(spec)):
        raise ValueError(
            f"{text!r} is not a package requirement: give a name from the package index, "
            "with extras and a version if wanted: email-validator, 'pydantic[email]', "
            "'httpx>=0.28,<0.30'"
        )
    extras = tuple(e.strip() for e in (match.group("extras") or "").split(",") if e.strip())
    return Requirement(match.group("name"), extras, spec, (match.group("marker") or "").strip())


def dependency_strings(text: str) -> list[tuple[int, int]]:
    """The spans of the strings of `[project].dependencies` in pyproject.toml's `text`
    (quotes included), and, last, the span of its closing bracket; ValueError if the
    array is not found as `dependencies = [` under `[project]`."""
    project = re.search(r"^\[project\][ \t]*(#.*)?$", text, re.M)
    if project is None:
        raise ValueError("no [project] table")
    table_end = re.search(r"^\[", text[project.end() :], re.M)
    end = project.end() + table_end.start() if table_end else len(text)
    array = re.compile(r"^dependencies[ \t]*=[ \t]*\[", re.M).search(text, project.end(), end)
    if array is None:
        raise ValueError("no `dependencies = [` in [project]")
    spans: list[tuple[int, int]] = []
    i, depth = array.end(), 1
    while i < len(text):
        char = text[i]
        if char == "#":
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
            continue
        if char in "\"'":
            close = _string_end(text, i)
            if depth == 1:
                spans.append((i, close))
            i = close
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0:
            return [*spans, (i, i + 1)]
        i += 1
    raise ValueError("[project].dependencies is not closed")


def _string_end(text: str, start: int) -> int:
    """The index after the TOML string (basic or literal, one line) starting at `start`."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote:
        i += 2 if quote == '"' and text[i] == "\\" else 1
    return i + 1


def with_requirement(text: str, requirement: Requirement) -> tuple[str, str]:
    """pyproject.toml's `text` with `requirement` in `[project].dependencies`: merged into
    the entry of the same package (`Requirement.merged`), else appended on a line of its
    own; only that entry's text changes. And a line saying what was done."""
    entries = tomllib.loads(text)["project"]["dependencies"]
    *spans, (close, _) = dependency_strings(text)
    if len(spans) != len(entries):
        raise ValueError("the dependencies are not all plain strings")
    same = [i for i, entry in enumerate(entries) if requirement_name(entry) == requirement.key]
    if same:
        i = same[0]
        old = parse_requirement(entries[i])
        new = old.merged(requirement)
        if str(new) == entries[i] or new == old:
            return text, f"{entries[i]!r} is in [project].dependencies already"
        start, end = spans[i]
        changed = text[:start] + json.dumps(str(new)) + text[end:]
        return changed, f"[project].dependencies: {entries[i]!r} -> {str(new)!r}"
    quoted = json.dumps(str(requirement))
    if not spans:
        changed = text[:close] + f"\n    {quoted},\n" + text[close:]
    elif "\n" not in text[spans[-1][1] : close]:  # a one-line array
        changed = text[: spans[-1][1]] + f", {quoted}" + text[spans[-1][1] :]
    else:
        last_start, last_end = spans[-1]
        line_start = text.rfind("\n", 0, last_start) + 1
        indent = re.match(r"[ \t]*", text[line_start:]).group(0)  # type: ignore[union-attr]
        after = text[last_end:]
        comma = re.match(r"[ \t]*,", after)
        head = text[:last_end] + (after[: comma.end()] if comma else ",")
        rest = after[comma.end() :] if comma else after
        line_end = rest.find("\n")
        changed = head + rest[:line_end] + f"\n{indent}{quoted}," + rest[line_end:]
    return changed, f"[project].dependencies += {str(requirement)!r}"


def edit_pyproject(text: str, requirements: list[Requirement]) -> tuple[str, list[str]]:
    """pyproject.toml's text with every requirement added (`with_requirement`), checked by
    reading it back; SystemExit if its dependencies cannot be edited as text."""
    done = []
    try:
        for requirement in requirements:
            text, said = with_requirement(text, requirement)
            done.append(said)
        entries = tomllib.loads(text)["project"]["dependencies"]
    except (ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(
            f"add-package: cannot edit pyproject.toml's [project].dependencies ({exc}): add "
            "the requirement there by hand, then run scripts/add-package with it again"
        ) from None
    for requirement in requirements:
        if not any(requirement_name(e) == requirement.key for e in entries):
            raise SystemExit(f"add-package: editing pyproject.toml lost {str(requirement)!r}")
    return text, done


def keep_venv_stamp(old_text: str, new_text: str) -> None:
    """.venv stays marked as matching pyproject.toml when it matched before the edit
    (add-package installs what the edit adds), so scripts/setup-python does not reinstall."""
    if not VENV_STAMP.is_file():
        return
    stamp = VENV_STAMP.read_text()
    old_hash = hashlib.sha256(old_text.encode()).hexdigest()
    if stamp.startswith(old_hash + " "):
        new_hash = hashlib.sha256(new_text.encode()).hexdigest()
        VENV_STAMP.write_text(new_hash + stamp[len(old_hash) :])


def install_in_venv(pins: dict[str, str], index_url: str | None) -> str:
    """The same versions installed into .venv (CPython's wheels of them, from the index),
    so the agent imports there too; a line saying what happened."""
    if not VENV_PYTHON.exists():
        return ".venv: none yet (scripts/setup-python makes it from pyproject.toml)"
    if not pins:
        return ".venv: nothing new to install"
    has_pip = subprocess.run(
        [str(VENV_PYTHON), "-m", "pip", "--version"], capture_output=True, check=False
    )
    pip_command = (
        [str(VENV_PYTHON), "-m", "pip"]
        if has_pip.returncode == 0
        else [sys.executable, "-m", "pip", "--python", str(VENV_PYTHON)]
    )
    wanted = [f"{name}=={version}" for name, version in sorted(pins.items())]
    index = ["--index-url", index_url] if index_url else []
    result = subprocess.run(
        [*pip_command, "--disable-pip-version-check", "install", "--quiet", *index, *wanted],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise SystemExit(
            f"add-package: the Worker has the packages, but pip could not install "
            f"{' '.join(wanted)} into .venv (CPython):\n{tail}\nThe agent does not import on "
            "CPython until it can (scripts/setup-python installs pyproject.toml's dependencies)"
        )
    return f".venv: installed {' '.join(wanted)}"


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def add(texts: list[str], index_url: str | None = None) -> int:
    """scripts/add-package: see the module's docstring and docs/packages.md."""
    try:
        requirements = [parse_requirement(text) for text in texts]
    except ValueError as exc:
        raise SystemExit(f"add-package: {exc}") from None
    check_pyodide_abi()
    old_text = PYPROJECT.read_text()
    new_text, edits = edit_pyproject(old_text, requirements)
    old_pins = read_lock() if LOCK.exists() else {}
    wanted = [*tomllib.loads(new_text)["project"]["dependencies"], *RUNTIME_REQUIREMENTS]
    print(
        f"add-package: resolving {', '.join(map(str, requirements))} for the Worker (CPython "
        f"{PYTHON} on Pyodide: pure-Python or {PLATFORM} wheels)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as scratch:
        try:
            resolved = resolve(wanted, old_pins, Path(scratch), index_url)
        except Refused as exc:
            raise SystemExit(f"add-package: refused, nothing changed: {exc}") from None
        cache(resolved)
    pins = {name: wheel.version for name, wheel in resolved.items()}
    for line in edits:
        print(f"add-package: pyproject.toml {line}")
    print_changes("add-package", old_pins, pins)
    if new_text != old_text:
        PYPROJECT.write_text(new_text)
        keep_venv_stamp(old_text, new_text)
    write_lock(pins)
    # .venv before python_modules/: a running scripts/dev reloads the Worker when
    # python_modules/ changes, and checks the agent on CPython (.venv) as it does.
    runtime = {normalize(n) for n in RUNTIME_REQUIREMENTS}
    new = {n: v for n, v in pins.items() if old_pins.get(n) != v and n not in runtime}
    named = {r.key: pins[r.key] for r in requirements if r.key in pins}
    print(f"add-package: {install_in_venv({**new, **named}, index_url)}", flush=True)
    before = tree_bytes(TARGET)
    vendor(pins, "add-package")
    after = tree_bytes(TARGET)
    print(
        f"add-package: python_modules/ is {after / 2**20:.1f} MiB ({(after - before) / 2**10:+.0f} "
        "KiB); `python3 scripts/bundle_size.py` measures the deploy bundle (Cloudflare's "
        "limit: 3 MB gzipped on the free plan, 10 MB on paid plans)"
    )
    print(
        "add-package: a running scripts/dev reloads the Worker with it now; commit "
        "pyproject.toml and scripts/pyodide-lock.txt"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["add"]:
        adding = argparse.ArgumentParser(
            prog="scripts/add-package",
            description="Add a package the Worker needs (docs/packages.md).",
        )
        adding.add_argument("requirement", nargs="+", help="NAME[extras][version spec]")
        adding.add_argument("--index-url", help="the package index (default: pip's)")
        options = adding.parse_args(argv[1:])
        return add(options.requirement, options.index_url)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relock", action="store_true", help="re-resolve and rewrite the lock")
    args = parser.parse_args(argv)

    check_pyodide_abi()
    if args.relock or not LOCK.exists():
        relock()
    pins = read_lock()
    check_lock_covers_requirements(pins)
    vendor(pins)
    return 0


if __name__ == "__main__":
    sys.exit(main())
