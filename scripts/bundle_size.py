#!/usr/bin/env python3
"""The Worker's deploy bundle: its size, raw and gzipped, what it holds, how fast it imports.

    python3 scripts/bundle_size.py                 # sizes and the Worker's modules
    python3 scripts/bundle_size.py --import-time   # and `import entry` timed in the local runtime

Builds the bundle exactly as a deploy does, offline: `npx wrangler deploy
--dry-run --outdir <tmp>` (which runs wrangler.toml's `[build]` command,
scripts/build_worker.py, first). The sizes are wrangler's own figures
("Total Upload: ... / gzip: ..."), the ones Cloudflare's size limits apply
to (3 MB gzipped on the free plan, 10 MB on paid plans). `--import-time` runs
scripts/bundle_check.mjs: the local runtime started on the bundle alone,
`import entry` timed on a first start (compiling .pyc files) and a second
one (reusing them), then one turn served from it.

stdlib only (wrangler and the local runtime need `scripts/setup-runtime`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
_TOTALS = re.compile(r"Total Upload: ([\d.]+) KiB / gzip: ([\d.]+) KiB")


@dataclass(frozen=True)
class Bundle:
    """What `wrangler deploy --dry-run --outdir` made."""

    outdir: Path
    upload_kib: float
    gzip_kib: float
    worker_files: tuple[str, ...]  # the Worker's own modules, relative to the bundle root
    vendored_files: tuple[str, ...]  # python_modules/..., relative to the bundle root

    @property
    def worker_modules(self) -> set[str]:
        """The Worker's own modules as dotted names (a package by its name)."""
        names = set()
        for file in self.worker_files:
            parts = file.removesuffix(".py").split("/")
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        return names

    def size(self, files: tuple[str, ...]) -> int:
        return sum((self.outdir / f).stat().st_size for f in files)


def wrangler_env() -> dict[str, str]:
    return {**os.environ, "CI": "true", "WRANGLER_SEND_METRICS": "false", "NO_COLOR": "1"}


def dry_run(outdir: Path, config: Path = PROJECT / "wrangler.toml") -> Bundle:
    """Build the deploy bundle into `outdir` (offline) and read wrangler's totals."""
    command = ["npx", "--no-install", "wrangler", "deploy", "--dry-run", "--outdir", str(outdir)]
    command += ["--config", str(config)]
    done = subprocess.run(
        command, cwd=PROJECT, env=wrangler_env(), capture_output=True, text=True, check=False
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"bundle_size: {' '.join(command)} failed:\n{output}")
    totals = _TOTALS.search(output)
    if totals is None:
        raise SystemExit(f"bundle_size: no 'Total Upload' line in wrangler's output:\n{output}")
    files = sorted(
        p.relative_to(outdir).as_posix()
        for p in outdir.rglob("*")
        if p.is_file() and p.relative_to(outdir).as_posix() != "README.md"  # wrangler's note
    )
    return Bundle(
        outdir=outdir,
        upload_kib=float(totals.group(1)),
        gzip_kib=float(totals.group(2)),
        worker_files=tuple(f for f in files if not f.startswith("python_modules/")),
        vendored_files=tuple(f for f in files if f.startswith("python_modules/")),
    )


def check_vars(config: Path, extra: dict[str, str]) -> dict[str, str]:
    """The Worker's env for bundle_check.mjs: `[vars]`, a token, the offline model, and
    every empty `*_URL` setting pointed at a local server answering 200 {} ("{{echo}}")."""
    settings = {k: str(v) for k, v in tomllib.loads(config.read_text()).get("vars", {}).items()}
    settings.update({"API_TOKEN": "bundle-check", "LLM_PROVIDER": "demo"})
    for name, value in settings.items():
        if name.endswith("_URL") and name != "LLM_BASE_URL" and not value.strip():
            settings[name] = "{{echo}}"
    settings.update(extra)
    return settings


def run_from_bundle(
    bundle: Bundle, config: Path, variables: dict[str, str], starts: int = 2
) -> dict[str, Any]:
    """scripts/bundle_check.mjs on the bundle: its one line of JSON."""
    durable_objects = {
        b["name"]: b["class_name"]
        for b in tomllib.loads(config.read_text()).get("durable_objects", {}).get("bindings", [])
    }
    command = [
        "node", str(PROJECT / "scripts" / "bundle_check.mjs"), str(bundle.outdir),
        "--config", str(config), "--vars", json.dumps(variables),
        "--durable-objects", json.dumps(durable_objects), "--starts", str(starts),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bundle_size: the Worker does not run from its bundle:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=PROJECT / "wrangler.toml")
    parser.add_argument("--outdir", type=Path, help="keep the bundle here (default: a temp dir)")
    parser.add_argument("--import-time", action="store_true", help="time `import entry` in it")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--json", action="store_true", help="print one line of JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bundle-") as scratch:
        bundle = dry_run(args.outdir or Path(scratch) / "dist", args.config.resolve())
        report: dict[str, Any] = {
            "upload_kib": bundle.upload_kib,
            "gzip_kib": bundle.gzip_kib,
            "worker_modules": len(bundle.worker_files),
            "worker_kib": round(bundle.size(bundle.worker_files) / 1024, 1),
            "vendored_files": len(bundle.vendored_files),
            "vendored_kib": round(bundle.size(bundle.vendored_files) / 1024, 1),
        }
        if args.import_time:
            extra = dict(v.split("=", 1) for v in args.var)
            ran = run_from_bundle(bundle, args.config, check_vars(args.config, extra))
            report["import_entry_ms"] = {"first_start": ran["starts"][0], "next": ran["starts"][-1]}
            report["turn"] = {"status": ran["status"], "body_status": ran["body"].get("status")}
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"upload {report['upload_kib']:.0f} KiB, gzip {report['gzip_kib']:.0f} KiB "
        f"(wrangler's figures); the Worker's own modules: {report['worker_modules']} files, "
        f"{report['worker_kib']} KiB; python_modules/: {report['vendored_files']} files, "
        f"{report['vendored_kib']} KiB"
    )
    for file in bundle.worker_files:
        print(f"  {file}")
    if args.import_time:
        ms = report["import_entry_ms"]
        print(
            f"import entry, in the local runtime from the bundle alone: {ms['first_start']} ms "
            f"on a first start (compiling .pyc), {ms['next']} ms on the next; a turn served "
            f"from it: HTTP {report['turn']['status']} {report['turn']['body_status']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
