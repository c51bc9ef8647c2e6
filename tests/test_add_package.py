"""`scripts/add-package` and the Worker's lock (scripts/vendor.py), against a package index
served on 127.0.0.1: never PyPI.

The index (PEP 503 simple pages over real HTTP) holds the Worker's cached wheels
(.cache/wheels: what scripts/pyodide-lock.txt pins) and wheels built here with `zipfile`:
pure-Python ones, one with only a source distribution, one with only a native manylinux
wheel, and an `httpx 0.29.0` newer than the pinned 0.28.1 (the issue's silent move). Each
test runs the commands in a temporary project holding copies of pyproject.toml, the lock
and the scripts, with a virtualenv of its own, pip pointed at the index (PIP_INDEX_URL)
and the machine's pip settings left out.

- A pure-Python package is added: pyproject.toml gains one line (its comments kept), the
  lock gains its pins and keeps every other (httpx stays 0.28.1 though 0.29.0 is on the
  index), python_modules/ and .venv get it, and the changes are printed.
- A package with only a source distribution, or needing one with only a native wheel, is
  refused naming that package, and nothing changes.
- A pin moves only when the new package needs another version: `tinydns 1.0 -> 2.0`.
- `--relock` prints what moved (`httpx 0.28.1 -> 0.29.0`); with the lock reverted,
  set-up uses the pinned wheel from the cache beside the other version, offline, and
  downloads a pinned version the cache lacks.

Needs the Worker's wheels in .cache/wheels (scripts/setup-runtime) and python3 with pip.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

PROJECT = Path(__file__).resolve().parents[1]
WHEELS = PROJECT / ".cache" / "wheels"
PYTHON = shutil.which("python3") or sys.executable


def _vendor_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vendor", PROJECT / "scripts" / "vendor.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vendor"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


vendor = _vendor_module()


def build_wheel(
    folder: Path, name: str, version: str, tag: str = "py3-none-any", requires: tuple[str, ...] = ()
) -> Path:
    """A wheel of one module `name` (VERSION = version) with its METADATA, WHEEL and RECORD."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nTag: {tag}\n",
    }
    path = folder / f"{module}-{version}-{tag}.whl"
    record = []
    with zipfile.ZipFile(path, "w") as archive:
        for file, text in files.items():
            data = text.encode()
            archive.writestr(file, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{file},sha256={digest.decode()},{len(data)}")
        archive.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def httpx_requirements() -> tuple[str, ...]:
    """What the pinned httpx wheel requires (not for an extra): the newer one needs the same."""
    wheel = next(WHEELS.glob("httpx-0.28.1-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("httpx-0.28.1.dist-info/METADATA").decode()
    found = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    return tuple(r for r in found if "extra ==" not in r)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 simple index on 127.0.0.1: its URL."""
    assert any(WHEELS.glob("pydantic-*.whl")), (
        "no wheels in .cache/wheels: scripts/setup-runtime (scripts/test runs it) puts them there"
    )
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    for wheel in WHEELS.glob("*.whl"):
        (files / wheel.name).symlink_to(wheel)
    build_wheel(files, "tinymail", "1.0", requires=("tinydns>=1",))
    build_wheel(files, "tinydns", "1.0")
    build_wheel(files, "tinydns", "2.0")
    build_wheel(files, "needsnewer", "1.0", requires=("tinydns>=2",))
    build_wheel(files, "needsnative", "1.0", requires=("nativepkg",))
    build_wheel(files, "nativepkg", "1.0", tag="cp314-cp314-manylinux_2_17_x86_64")
    build_wheel(files, "httpx", "0.29.0", requires=httpx_requirements())
    (files / "onlysdist-1.0.tar.gz").write_bytes(b"not read")
    for file in sorted(files.iterdir()):
        name = vendor.normalize(re.split(r"-\d", file.name, maxsplit=1)[0])
        page = root / "simple" / name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        with page.open("a") as out:
            out.write(f'<a href="../../files/{file.name}">{file.name}</a>\n')
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The files the commands read and write, copied; a virtualenv without pip (pip is
    run on it with --python) marked as matching pyproject.toml as scripts/setup-python
    marks it."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    for name in ("vendor.py", "add-package", "pyodide-lock.txt"):
        shutil.copy2(PROJECT / "scripts" / name, root / "scripts" / name)
    shutil.copy2(PROJECT / "pyproject.toml", root / "pyproject.toml")
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv" / ".installed-stamp").write_text(f"{digest} {root}\n")
    return root


def run(
    project: Path, *args: str, index: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """A command of the project (`scripts/add-package ...` or `scripts/vendor.py ...`)
    with pip on `index` alone, no pip settings of the machine, no cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index, PIP_NO_CACHE_DIR="1")
    command = [PYTHON, *args] if args[0].endswith(".py") else list(args)
    result = subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def pins(project: Path) -> dict[str, str]:
    lines = (project / "scripts" / "pyodide-lock.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def dependencies(project: Path) -> list[str]:
    data = tomllib.loads((project / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def venv_has(project: Path, name: str, version: str) -> bool:
    return any(project.glob(f".venv/lib/python*/site-packages/{name}-{version}.dist-info"))


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file of the project but the virtualenv's own, by path."""
    return {
        str(p.relative_to(project)): p.read_bytes()
        for p in sorted(project.rglob("*"))
        if p.is_file() and not p.is_relative_to(project / ".venv" / "bin")
    }


def test_a_pure_python_package_is_added_keeping_every_pin(project: Path, index: str) -> None:
    before_text = (project / "pyproject.toml").read_text()
    before = pins(project)
    out = run(project, "scripts/add-package", "tinymail", index=index).stdout

    # pyproject.toml: one line more, after the last dependency; its comments are kept.
    after_text = (project / "pyproject.toml").read_text()
    added = [line for line in after_text.splitlines() if line not in before_text.splitlines()]
    assert added == ['    "tinymail",']
    assert after_text.replace('    "tinymail",\n', "", 1) == before_text
    assert dependencies(project)[-1] == "tinymail"
    # The lock: the new pins, every other kept (httpx 0.29.0 is on the index: not taken).
    assert pins(project) == {**before, "tinymail": "1.0", "tinydns": "2.0"}
    assert "pyodide-lock.txt changed (16 wheels):\n  + tinydns 2.0\n  + tinymail 1.0\n" in out
    assert "httpx 0.28.1 ->" not in out
    # python_modules/: the whole lock, the new package included; .venv has it too.
    assert (project / "python_modules" / "tinymail" / "__init__.py").read_text() == (
        "VERSION = '1.0'\n"
    )
    assert (project / "python_modules" / "httpx-0.28.1.dist-info").is_dir()
    assert (project / "python_modules" / "pydantic_core").is_dir()
    assert venv_has(project, "tinymail", "1.0")
    assert venv_has(project, "tinydns", "2.0")
    # .venv is still taken as matching pyproject.toml: set-up will not reinstall it.
    digest = hashlib.sha256(after_text.encode()).hexdigest()
    assert (project / ".venv" / ".installed-stamp").read_text() == f"{digest} {project}\n"
    assert "a running scripts/dev reloads the Worker with it now" in out
    print(out)


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        (
            "onlysdist",
            "add-package: refused, nothing changed: onlysdist has no wheel the Worker can "
            "load: it has only source distributions (onlysdist-1.0.tar.gz).",
        ),
        (
            "needsnative",
            "add-package: refused, nothing changed: nativepkg (needed by needsnative) has no "
            "wheel the Worker can load: it has only native wheels, for other platforms "
            "(manylinux_2_17_x86_64).",
        ),
    ],
)
def test_a_package_without_a_wheel_for_pyodide_is_refused_and_nothing_changes(
    project: Path, index: str, requirement: str, why: str
) -> None:
    before = snapshot(project)
    result = run(project, "scripts/add-package", requirement, index=index, check=False)
    assert result.returncode == 1
    assert why in result.stderr
    assert "pure-Python wheels (py3-none-any) and wheels built for Pyodide" in result.stderr
    assert snapshot(project) == before
    assert not (project / "python_modules").exists()
    assert not venv_has(project, requirement, "1.0")


def test_a_pin_moves_only_when_the_new_package_needs_another_version(
    project: Path, index: str
) -> None:
    lock = project / "scripts" / "pyodide-lock.txt"
    lock.write_text(lock.read_text() + "tinydns==1.0\n")
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace('    "pydantic>=2",', '    "tinydns",\n    "pydantic>=2",'))
    before = pins(project)
    out = run(project, "scripts/add-package", "needsnewer", index=index).stdout
    assert "changed (16 wheels):\n  + needsnewer 1.0\n  tinydns 1.0 -> 2.0\n" in out
    assert pins(project) == {**before, "needsnewer": "1.0", "tinydns": "2.0"}
    assert (project / "python_modules" / "tinydns" / "__init__.py").read_text() == (
        "VERSION = '2.0'\n"
    )


def test_relock_says_what_moved_and_the_cache_serves_the_pinned_version(
    project: Path, index: str
) -> None:
    # Set up as scripts/setup-runtime left it: the pinned wheels in the cache.
    shutil.copytree(WHEELS, project / ".cache" / "wheels")
    lock = project / "scripts" / "pyodide-lock.txt"
    pinned = lock.read_text()
    out = run(project, "scripts/vendor.py", "--relock", index=index).stdout
    assert "scripts/pyodide-lock.txt changed (14 wheels):\n  httpx 0.28.1 -> 0.29.0\n" in out
    assert pins(project)["httpx"] == "0.29.0"
    cached = {p.name for p in (project / ".cache" / "wheels").glob("httpx-*")}
    assert cached == {"httpx-0.28.1-py3-none-any.whl", "httpx-0.29.0-py3-none-any.whl"}

    # The lock reverted: set-up takes the pinned 0.28.1 from the cache beside 0.29.0,
    # with no index at all (nothing is downloaded).
    lock.write_text(pinned)
    out = run(project, "scripts/vendor.py", index="http://127.0.0.1:9/simple/").stdout
    assert "downloading" not in out
    assert (project / "python_modules" / "httpx-0.28.1.dist-info").is_dir()
    assert not (project / "python_modules" / "httpx-0.29.0.dist-info").exists()

    # A pinned version the cache lacks (only another version is there) is downloaded.
    (project / ".cache" / "wheels" / "httpx-0.28.1-py3-none-any.whl").unlink()
    (project / "python_modules" / ".vendor-stamp").unlink()
    out = run(project, "scripts/vendor.py", index=index).stdout
    assert "vendor: downloading httpx==0.28.1" in out
    assert (project / "python_modules" / "httpx-0.28.1.dist-info").is_dir()


# -- editing pyproject.toml as text ---------------------------------------------------------

PYPROJECT = """\
[project]
name = "x"
dependencies = [
    "pydantic>=2",
    "httpx>=0.27",  # why
]  # end

[tool.other]
dependencies = ["not-these"]
"""


@pytest.mark.parametrize(
    ("requirement", "edited"),
    [
        ("email-validator", '    "httpx>=0.27",  # why\n    "email-validator",\n]  # end'),
        ("pydantic[email]", '    "pydantic[email]>=2",\n    "httpx>=0.27",  # why\n]'),
        ("HTTPX<0.29", '    "httpx<0.29",  # why\n]'),
        ("tiny ; python_version >= '3.12'", "    \"tiny; python_version >= '3.12'\",\n]"),
    ],
)
def test_a_requirement_is_added_or_merged_keeping_the_files_text(
    requirement: str, edited: str
) -> None:
    text, _ = vendor.edit_pyproject(PYPROJECT, [vendor.parse_requirement(requirement)])
    assert edited in text
    assert text.endswith('[tool.other]\ndependencies = ["not-these"]\n')
    assert len(text.splitlines()) - len(PYPROJECT.splitlines()) in (0, 1)


def test_a_requirement_already_there_changes_nothing() -> None:
    for requirement in ("httpx", "HTTPX>=0.27", "pydantic>=2"):
        text, done = vendor.edit_pyproject(PYPROJECT, [vendor.parse_requirement(requirement)])
        assert text == PYPROJECT
        assert done[0].endswith("is in [project].dependencies already")


def test_one_line_and_empty_dependency_arrays_take_a_requirement() -> None:
    one_line = '[project]\ndependencies = ["a", "b"]\n'
    assert vendor.edit_pyproject(one_line, [vendor.parse_requirement("c>=1")])[0] == (
        '[project]\ndependencies = ["a", "b", "c>=1"]\n'
    )
    empty = "[project]\ndependencies = []\n"
    assert vendor.edit_pyproject(empty, [vendor.parse_requirement("c")])[0] == (
        '[project]\ndependencies = [\n    "c",\n]\n'
    )


@pytest.mark.parametrize(
    "text", ["https://example.com/x.whl", "x @ https://example.com/x.whl", "x>>1", "-e ."]
)
def test_what_is_not_a_requirement_by_name_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a package requirement: give a name"):
        vendor.parse_requirement(text)


def test_lock_changes_name_what_was_gained_changed_and_lost() -> None:
    old = {"httpx": "0.28.1", "idna": "3.20", "gone": "1.0"}
    new = {"httpx": "0.29.0", "idna": "3.20", "dnspython": "2.8.0"}
    assert vendor.lock_changes(old, new) == [
        "+ dnspython 2.8.0",
        "- gone 1.0",
        "httpx 0.28.1 -> 0.29.0",
    ]


def test_a_cached_wheel_stands_for_a_pin_only_at_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vendor, "CACHE", tmp_path)
    build_wheel(tmp_path, "httpx", "0.28.1")
    build_wheel(tmp_path, "httpx", "0.29.0")
    build_wheel(tmp_path, "native", "1.0", tag="cp314-cp314-manylinux_2_17_x86_64")
    found = vendor.cached_wheels({"httpx": "0.28.1", "native": "1.0"})
    assert {name: path.name for name, path in found.items()} == {
        "httpx": "httpx-0.28.1-py3-none-any.whl"
    }
