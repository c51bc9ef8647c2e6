#!/usr/bin/env python3
"""Assemble the Pyodide development bundle that workerd loads offline.

    python3 scripts/pyodide_bundle.py [--pyodide node_modules/pyodide] [--out .cache/pyodide-bundle]

workerd normally downloads Cloudflare's official Pyodide bundle when a Python
Worker starts (and checks its sha256, pinned in the binary). Offline, it runs
with its testing-only compatibility flag `python_workers_development`, which
selects the same Pyodide (314.0.6 in workerd 1.20261117.1) without a checksum
and reads `pyodide_dev.capnp.bin` from `--pyodide-bundle-disk-cache-dir`.

That file is a Cap'n Proto `Bundle` (workerd's `jsg/modules.capnp`) of three
internal modules taken from the npm `pyodide` package of that version:

    pyodideRuntime-internal:pyodide.asm         the Emscripten glue (ES module)
    pyodideRuntime-internal:pyodide.asm.wasm    its WebAssembly
    pyodideRuntime-internal:python_stdlib.zip   the standard library

The glue gets the source edits workerd's own build makes to it (its
`src/pyodide/helpers.bzl`): WebAssembly compilation, `Date.now`, random bytes,
dynamic library loading and `eval` go through functions of workerd's
`pyodide-internal:builtin_wrappers`, which is compiled into the binary.

Beside it goes `baseline.bin`: workerd's baseline snapshot of that Pyodide (memory after
Pyodide and the standard library are set up, before any Worker code), made by
`workerd test --python-save-baseline-snapshot` on a one-line Worker. Loaded by
runtime/workerd (`--python-load-snapshot`), it saves each start the Pyodide set-up, as
Cloudflare's own baseline snapshots do. `--workerd` names the binary (default: the one
of node_modules).

Both are rebuilt only when their inputs change (stamps beside them). stdlib only; the
Cap'n Proto encoding is written here (one segment, no packing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
BUNDLE_NAME = "pyodide_dev.capnp.bin"
SNAPSHOT_NAME = "baseline.bin"
WORKERD = PROJECT / "node_modules" / "@cloudflare" / "workerd-linux-64" / "bin" / "workerd"
# The flags of runtime/dev.py's development bundle, and the built-in workers SDK (this
# Worker vendors none): the snapshot is taken before any Worker code runs.
_SNAPSHOT_CONFIG = """using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (services = [(name = "main", worker = .main)]);
const main :Workerd.Worker = (
  modules = [(name = "worker.py", pythonModule = embed "worker.py")],
  compatibilityDate = "2026-09-08",
  compatibilityFlags = ["python_workers", "python_workers_development",
    "no_python_workers_20250116", "no_python_workers_314", "disable_python_external_sdk"],
);
"""
_SNAPSHOT_WORKER = """from workers import WorkerEntrypoint


class Default(WorkerEntrypoint):
    def test(self):
        pass
"""
PREFIX = "pyodideRuntime-internal:"

_PRELUDE = (
    "import {\n"
    "  getRandomValues, monotonicDateNow, newWasmModule, patchedLoadLibData,\n"
    "  wasmInstantiate, patched_PyEM_CountFuncParams,\n"
    '} from "pyodide-internal:builtin_wrappers";\n'
)
_NO_EVAL = (
    "(() => {throw new Error('Internal Emscripten code tried to eval, "
    "this should not happen, please file a bug report')})()"
)
# (text of pyodide.asm.mjs, replacement, how many times it must occur: None = any number >= 1).
# workerd's list, less `reportUndefinedSymbols()`: its wrapper is not in this binary, and
# 314 runs with the call as it is.
EDITS: list[tuple[str, str, int | None]] = [
    ("new WebAssembly.Module", "newWasmModule", None),
    ("WebAssembly.instantiate", "wasmInstantiate", None),
    ("Date.now", "monotonicDateNow", None),
    ("crypto.getRandomValues(", "getRandomValues(Module, ", 1),
    ("eval(func)", _NO_EVAL, None),
    ("eval(data)", _NO_EVAL, None),
    ("eval(UTF8ToString(ptr))", _NO_EVAL, None),
    (
        "function loadLibData(){",
        "function loadLibData(){"
        "var libData = patchedLoadLibData(Module, libName, flags.rpath);"
        "return flags.loadAsync ? Promise.resolve(libData) : libData;}"
        "function unusedLoadLibData(){",
        1,
    ),
    ("getMemory(", "Module.getMemoryPatched(Module, libName, ", 1),
    (
        "export default _createPyodideModule;",
        _PRELUDE + "export default _createPyodideModule; export { _createPyodideModule };",
        1,
    ),
]


def patch_glue(source: str) -> str:
    """pyodide.asm.mjs as workerd's build edits it; refuses a glue the edits do not fit."""
    for old, new, times in EDITS:
        found = source.count(old)
        if found == 0 or (times is not None and found != times):
            want = "at least once" if times is None else f"{times} time(s)"
            raise SystemExit(
                f"pyodide_bundle: pyodide.asm.mjs has {old!r} {found} time(s), expected {want}"
            )
        source = source.replace(old, new)
    return source


# -- Cap'n Proto, just what a Bundle needs --------------------------------------------------

_BYTE_LIST = 2  # element size code of List(UInt8): Text and Data
_COMPOSITE = 7
# Module's layout (jsg/modules.capnp): data section 1 word (type: UInt16 @ 0, the union's
# discriminant: UInt16 @ 1), pointers: name, the union (src | wasm | data | json),
# tsDeclaration, compileCache.
_MODULE_DATA_WORDS, _MODULE_POINTERS = 1, 4
_UNION = {"src": 0, "wasm": 1, "data": 2, "json": 3}
_INTERNAL = 2  # ModuleType.internal


class _Segment:
    """One Cap'n Proto segment: 8-byte words, objects appended in order."""

    def __init__(self) -> None:
        self.words = bytearray()

    def alloc(self, n_words: int) -> int:
        at = len(self.words) // 8
        self.words += bytes(8 * n_words)
        return at

    def _put(self, at: int, value: int) -> None:
        struct.pack_into("<Q", self.words, 8 * at, value)

    def _offset(self, at: int, target: int) -> int:
        return ((target - at - 1) & 0x3FFFFFFF) << 2

    def struct_pointer(self, at: int, target: int, data_words: int, pointers: int) -> None:
        self._put(at, self._offset(at, target) | (data_words << 32) | (pointers << 48))

    def byte_list(self, at: int, blob: bytes) -> None:
        target = self.alloc((len(blob) + 7) // 8)
        self.words[8 * target : 8 * target + len(blob)] = blob
        self._put(at, 1 | self._offset(at, target) | (_BYTE_LIST << 32) | (len(blob) << 35))

    def struct_list(self, at: int, count: int, data_words: int, pointers: int) -> int:
        size = data_words + pointers
        tag = self.alloc(1 + count * size)
        self._put(at, 1 | self._offset(at, tag) | (_COMPOSITE << 32) | ((count * size) << 35))
        self._put(tag, (count << 2) | (data_words << 32) | (pointers << 48))
        return tag + 1


def encode_bundle(modules: list[tuple[str, str, bytes]]) -> bytes:
    """A `Bundle` message of internal modules, each (name, kind in _UNION, content)."""
    seg = _Segment()
    root = seg.alloc(1)
    bundle = seg.alloc(1)  # Bundle: no data, one pointer (modules)
    seg.struct_pointer(root, bundle, 0, 1)
    first = seg.struct_list(bundle, len(modules), _MODULE_DATA_WORDS, _MODULE_POINTERS)
    for i, (name, kind, content) in enumerate(modules):
        at = first + i * (_MODULE_DATA_WORDS + _MODULE_POINTERS)
        struct.pack_into("<HH", seg.words, 8 * at, _INTERNAL, _UNION[kind])
        seg.byte_list(at + 1, name.encode() + b"\0")  # Text ends with a NUL
        seg.byte_list(at + 2, content + (b"\0" if kind == "json" else b""))
    return struct.pack("<II", 0, len(seg.words) // 8) + bytes(seg.words)


def build(pyodide_dir: Path, out_dir: Path) -> Path:
    """Write out_dir/pyodide_dev.capnp.bin from pyodide_dir unless it is up to date."""
    version = json.loads((pyodide_dir / "package.json").read_text())["version"]
    names = ("pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")
    sources = {name: pyodide_dir / name for name in names}
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sources.values():
        digest.update(path.read_bytes())
    out = out_dir / BUNDLE_NAME
    stamp = out_dir / f"{BUNDLE_NAME}.stamp"
    wanted = f"pyodide {version} {digest.hexdigest()}"
    if out.exists() and stamp.exists() and stamp.read_text() == wanted:
        return out
    glue = patch_glue(sources["pyodide.asm.mjs"].read_text(encoding="utf-8"))
    message = encode_bundle(
        [
            (PREFIX + "pyodide.asm", "src", glue.encode()),
            (PREFIX + "pyodide.asm.wasm", "wasm", sources["pyodide.asm.wasm"].read_bytes()),
            (PREFIX + "python_stdlib.zip", "data", sources["python_stdlib.zip"].read_bytes()),
        ]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    partial.write_bytes(message)
    partial.replace(out)
    stamp.write_text(wanted)
    print(f"pyodide_bundle: {out} (Pyodide {version}, {len(message) / 2**20:.1f} MiB)")
    return out


def baseline_snapshot(workerd: Path, out_dir: Path) -> Path:
    """Write out_dir/baseline.bin (workerd's baseline snapshot of the bundle in out_dir)
    unless it is up to date for this bundle and this workerd."""
    out = out_dir / SNAPSHOT_NAME
    stamp = out_dir / f"{SNAPSHOT_NAME}.stamp"
    version = subprocess.run([workerd, "--version"], capture_output=True, text=True, check=True)
    wanted = f"{version.stdout.strip()} {(out_dir / f'{BUNDLE_NAME}.stamp').read_text()}"
    if out.exists() and stamp.exists() and stamp.read_text() == wanted:
        return out
    with tempfile.TemporaryDirectory(prefix="pyodide-snapshot-") as scratch:
        work = Path(scratch)
        (work / "config.capnp").write_text(_SNAPSHOT_CONFIG)
        (work / "worker.py").write_text(_SNAPSHOT_WORKER)
        done = subprocess.run(
            [
                workerd, "test", "--experimental", "config.capnp",
                "--python-save-baseline-snapshot", f"--python-snapshot-dir={work}",
                f"--pyodide-bundle-disk-cache-dir={out_dir}",
                f"--pyodide-package-disk-cache-dir={work}",
            ],
            cwd=work, capture_output=True, text=True, check=False,
        )  # fmt: skip
        made = work / "snapshot.bin"
        if done.returncode != 0 or not made.exists():
            raise SystemExit(
                f"pyodide_bundle: workerd made no snapshot:\n{done.stdout}{done.stderr}"
            )
        made.replace(out)
    stamp.write_text(wanted)
    print(
        f"pyodide_bundle: {out} (workerd's baseline snapshot, {out.stat().st_size / 2**20:.1f} MiB)"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyodide", type=Path, default=PROJECT / "node_modules" / "pyodide")
    parser.add_argument("--out", type=Path, default=PROJECT / ".cache" / "pyodide-bundle")
    parser.add_argument("--workerd", type=Path, default=WORKERD)
    args = parser.parse_args(argv)
    build(args.pyodide, args.out)
    baseline_snapshot(args.workerd, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
