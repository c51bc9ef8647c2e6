"""The dev server's dedicated memory snapshot: the kit's Worker started without importing
the kit and its packages again.

workerd (1.20261117) saves a dedicated snapshot, the Worker's memory after its main module's
import, with `--python-save-snapshot` and the `python_dedicated_snapshot` flag, and starts
from one with `--python-load-snapshot`, without importing the main again (as Cloudflare
does on deploy). Under this server only, the staged main (dev_limits.generated_main with
`preload`) imports the modules the kit's entry imports but the agent (pydantic, httpx, the
kit: ~2 s of workerd's CPU) and nothing else: the fetch wrapper of WORKERS_PLAN (JS state,
which a snapshot does not keep) and the entry with its agent run when the runtime collects
the main's handlers, right after the snapshot is restored, still at the Worker's start
(top-level entropy refused as on deploy; an agent that does not load answered as before).
So one snapshot serves every agent, and a reload after an agent edit restores it too.

The snapshot is kept in `.cache/dev-snapshot/<key>.bin`: `key` is a hash of what it holds
or depends on (the staged kit modules, the generated main, python_modules/'s stamp,
workerd's binary, the Pyodide bundle, the compatibility date, flags and
`[python_modules]`). A start with none saves one in the background once the server is
ready (a second `wrangler dev` of the staged Worker that serves nothing, at the lowest
priority), for the next start; that one starts from today's baseline snapshot. An edit of
the kit while the server runs takes the snapshot away from its next reloads (they import
everything again). `DURABLE_AGENTS_DEV_SNAPSHOT=off` never uses one.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dev_limits import process_alive  # runtime/, beside this file

FLAG = "python_dedicated_snapshot"
OFF_ENV = "DURABLE_AGENTS_DEV_SNAPSHOT"
FILE = "snapshot.bin"  # the name workerd saves it under, in --python-snapshot-dir
CLOSE_WAIT_S = 30
KEPT = 3  # snapshots kept in the cache (~23 MB each), the newest
# The entry's imports not preloaded: the agents, the dev server's note (staged per agent).
NOT_PRELOADED = ("agent", "agents", "_durable_agents_dev", "__future__")


def enabled(is_kit: bool, bundle: str, staged: bool) -> bool:
    """Whether this server uses a dedicated snapshot: this kit's Worker, staged under
    WORKERS_PLAN's limits, on the development bundle (the official one has its own), unless
    turned off."""
    off = os.environ.get(OFF_ENV, "").strip().lower() == "off"
    return is_kit and bundle == "development" and staged and not off


def preload(entry: Path) -> tuple[str, ...]:
    """The modules `entry` imports at its top level (a `from X import Y`: X), but the agent's."""
    found: list[str] = []
    for node in ast.parse(entry.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] not in NOT_PRELOADED and n not in found]
    return tuple(found)


def snapshot_key(
    kit_files: Iterable[Path], root: Path, stamp: Path, workerd: Path, runtime: Mapping[str, Any]
) -> str | None:
    """The hash of what a snapshot depends on (see the module's doc); None where
    python_modules/ has no stamp (its content cannot be told)."""
    if not stamp.is_file():
        return None
    digest = hashlib.sha256()
    workerd_stat = workerd.resolve().stat()
    head = {
        "stamp": stamp.read_text().strip(), "runtime": runtime,
        "workerd": [str(workerd.resolve()), workerd_stat.st_size, workerd_stat.st_mtime_ns],
    }  # fmt: skip
    digest.update(json.dumps(head, sort_keys=True, default=str).encode())
    for file in sorted(kit_files):
        digest.update(f"\0{file.relative_to(root)}\0".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:32]


def kit_files(built: Path, extra: Path) -> list[Path]:
    """The staged files a snapshot holds: the kit's package and entry (of `built`, the
    staged Worker's modules) and the generated main with the plan's module (`extra`)."""
    files = [p for p in (built / "durable_agents").rglob("*") if p.is_file()]
    files += [built / "entry.py", *(p for p in extra.iterdir() if p.is_file())]
    return [p for p in files if "__pycache__" not in p.parts]


class Snapshot:
    """One server's use of the cache `cache` (`.cache/dev-snapshot`): `folder` (in the
    server's staging folder) is what workerd is told to load from (runtime/workerd, at each
    start of workerd: wrangler starts a new one on each reload)."""

    def __init__(self, cache: Path, folder: Path, key: Callable[[], str | None]) -> None:
        self.cache = cache
        self.folder = folder
        self.key = key
        self.loaded = key()
        self.saver: subprocess.Popen[str] | None = None
        self._saving: threading.Thread | None = None
        self._say: Callable[[str], None] = print

    def cached(self) -> Path | None:
        return self.cache / f"{self.loaded}.bin" if self.loaded else None

    def use(self) -> bool:
        """Put the cached snapshot in `folder` if there is one; whether there was."""
        cached = self.cached()
        if cached is None or not cached.is_file():
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / FILE
        target.unlink(missing_ok=True)
        try:
            os.link(cached, target)  # the cache may be pruned meanwhile: the link stays
        except OSError:
            shutil.copyfile(cached, target)
        with contextlib.suppress(OSError):
            os.utime(cached)  # newest: pruned last
        return True

    def env(self) -> dict[str, str]:
        """runtime/workerd's environment: load `folder`'s snapshot (while it is there)."""
        return {
            "DURABLE_AGENTS_PYODIDE_SNAPSHOT_DIR": str(self.folder),
            "DURABLE_AGENTS_PYODIDE_SNAPSHOT": FILE,
        }

    def check(self) -> None:
        """After a rebuild, before wrangler sees it: the snapshot goes if what it holds
        changed (workerd then imports everything, as without one), and comes back when
        that is undone."""
        if self.key() == self.loaded:
            if not (self.folder / FILE).is_file():
                self.use()
        else:
            (self.folder / FILE).unlink(missing_ok=True)

    def save_in_background(
        self, start: Callable[[list[str], dict[str, str]], subprocess.Popen[str]],
        args: Sequence[str], env: Mapping[str, str], say: Callable[[str], None],
    ) -> None:  # fmt: skip
        """Save the snapshot for the next start: `start(args + its own, env)` runs `wrangler
        dev` of the staged Worker with workerd saving one (not from the baseline: workerd
        refuses that). One server at a time saves a key; the others go on without."""
        if self.loaded is None:
            return
        self.cache.mkdir(parents=True, exist_ok=True)
        lock = (self.cache / f"{self.loaded}.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            return
        work = self.cache / f"{self.loaded}.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        (work / "state").mkdir(parents=True)
        saving = {
            **env, "DURABLE_AGENTS_PYODIDE_SAVE_SNAPSHOT": "1",
            "DURABLE_AGENTS_PYODIDE_SNAPSHOT_DIR": str(work),
        }  # fmt: skip
        saving.pop("DURABLE_AGENTS_PYODIDE_SNAPSHOT", None)
        self.saver = start([*args, "--persist-to", str(work / "state")], saving)
        self._say = say
        self._saving = threading.Thread(target=self._save, args=(work, lock, say), daemon=True)
        self._saving.start()

    def _save(self, work: Path, lock: Any, say: Callable[[str], None]) -> None:
        saver = self.saver
        assert saver is not None
        assert saver.stdout is not None
        made = work / FILE
        ready = False
        try:
            # workerd writes the snapshot (at once, synchronously) before the Worker is ready.
            for line in saver.stdout:
                ready = "Ready on" in line
                if ready or "failed to start" in line:
                    break
            _stop(saver)
            if ready and made.is_file() and made.stat().st_size and self.key() == self.loaded:
                made.replace(self.cache / f"{self.loaded}.bin")
                _prune(self.cache)
                say("saved a memory snapshot of the kit's imports: the next start uses it")
        finally:
            _stop(saver)
            shutil.rmtree(work, ignore_errors=True)
            lock.close()

    def close(self) -> None:
        """At the server's exit: a save under way is waited for (up to CLOSE_WAIT_S, so
        that a server stopped soon after its first start leaves one for the next)."""
        if self._saving is not None and self._saving.is_alive():
            self._say("finishing the memory snapshot for the next start")
            self._saving.join(CLOSE_WAIT_S)
        if self.saver is not None:
            _stop(self.saver)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _prune(cache: Path) -> None:
    """Keep the KEPT newest snapshots; remove the work folders of saving servers that are
    gone (killed mid-save)."""
    found = sorted(cache.glob("*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[KEPT:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".lock").unlink(missing_ok=True)
    for work in cache.iterdir():
        pid = work.suffix[1:]
        if work.is_dir() and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(work, ignore_errors=True)
