#!/usr/bin/env python3
"""The Worker's deploy bundle: its size, raw and gzipped, what it holds, how fast it starts.

    python3 scripts/bundle_size.py                 # sizes, the largest parts, the Worker's modules
    python3 scripts/bundle_size.py --import-time   # and the Worker started from the bundle alone
    python3 scripts/bundle_size.py --limit-kib 3072   # the limit it checks (default_limit)

Builds the bundle exactly as a deploy does, offline: `wrangler deploy --dry-run
--outdir <tmp>` (which runs wrangler.toml's `[build]` command,
scripts/build_worker.py, first). The sizes are wrangler's own figures
("Total Upload: ... / gzip: ..."), the ones Cloudflare's size limits apply
to (3 MB gzipped on the free plan, 10 MB on paid plans), checked against a limit
(`default_limit`: the template's budget, LIMIT_KIB, which leaves a third of the free plan
to the packages you add; once you added some, the free plan's limit; exit status 1 over
it). Then the largest parts, each top-level package or module gzipped on its own
(`Bundle.contributors`), so what grew is plain. What of `python_modules/` is left out,
and why: wrangler.toml's `[python_modules] exclude`.

`--import-time` serves the bundle alone as a Worker of its own (`serve_bundle`): a
scratch project holding the bundle's modules and its python_modules/ (nothing else of
this repository), with a config made from wrangler.toml (its bindings, flags,
`[python_modules]` and `[vars]`; no `[build]`), run by `scripts/dev --config`
(runtime/dev.py: `wrangler dev` on real workerd, which loads Pyodide and imports the
Worker's modules before it is ready). Prints the dev server's `started in` figure and
the time of one turn served from the bundle.

stdlib only (wrangler and workerd need `scripts/setup-runtime`).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.server
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dev_process import PROJECT, RUNTIME_FIELDS, DevServer, scratch_worker, wrangler

_TOTALS = re.compile(r"Total Upload: ([\d.]+) KiB / gzip: ([\d.]+) KiB")
ECHO = "{{echo}}"  # a setting's value: the URL of a local server answering 200 {} to anything
# The template's budget, gzipped, in wrangler's KiB: about two thirds of the free plan's 3 MB,
# the rest left to your agent and the packages you add. tests/test_bundle.py holds it to it.
# (2,000 until recurring schedules: the IANA time zones, tzdata, are 70 KiB of it.)
LIMIT_KIB = 2100
FREE_PLAN_KIB = 3 * 1024
# The template's own requirements (pyproject.toml's [project].dependencies as it ships;
# scripts/add-package adds yours there): a new one of the kit's goes here too, or the
# budget would no longer hold the template to LIMIT_KIB.
KIT_REQUIREMENTS = frozenset({"pydantic", "httpx", "typing-extensions", "cronsim", "tzdata"})
TOP = 12  # the largest parts printed
TURN_PATH = "/sessions/bundle-check/messages"  # where run_from_bundle sends its turn


@dataclass(frozen=True)
class Bundle:
    """What `wrangler deploy --dry-run --outdir` made."""

    outdir: Path
    entry: str  # the Worker's main module, relative to the bundle root
    upload_kib: float
    gzip_kib: float
    worker_files: tuple[str, ...]  # the Worker's own modules, relative to the bundle root
    vendored_files: tuple[str, ...]  # python_modules/..., relative to the bundle root

    @property
    def worker_modules(self) -> set[str]:
        """The Worker's own modules as dotted names (a package by its name)."""
        names = set()
        for file in self.worker_files:
            if not file.endswith(".py"):
                continue  # package data (build_worker.DATA_SUFFIXES)
            parts = file.removesuffix(".py").split("/")
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        return names

    def size(self, files: tuple[str, ...]) -> int:
        return sum((self.outdir / f).stat().st_size for f in files)

    def contributors(self) -> list[tuple[str, int, int]]:
        """Each top-level package or module of the bundle (`part_of`) as (name, raw bytes,
        gzipped bytes), the largest gzipped first. Each part is gzipped alone, at wrangler's
        level (zlib's default, 6), so the parts add up to about wrangler's total."""
        parts: dict[str, list[bytes]] = {}
        for file in (*self.worker_files, *self.vendored_files):
            parts.setdefault(part_of(file), []).append((self.outdir / file).read_bytes())
        sizes = []
        for name, contents in parts.items():
            data = b"".join(contents)
            sizes.append((name, len(data), len(gzip.compress(data, compresslevel=6, mtime=0))))
        return sorted(sizes, key=lambda part: (-part[2], part[0]))

    def top(self, count: int = TOP) -> str:
        """The `count` largest parts (`contributors`), one line each."""
        return "\n".join(
            f"  {gz / 1024:7.1f} KiB gzip {raw / 1024:8.1f} KiB  {name}"
            for name, raw, gz in self.contributors()[:count]
        )


def part_of(file: str) -> str:
    """The part of the bundle `file` (relative to its root) counts in: its top-level package
    or module, `python_modules/` ones by their name there; the packages' metadata folders
    (`*.dist-info`) all in one part."""
    vendored = file.startswith("python_modules/")
    first = file.split("/")[1 if vendored else 0]
    if vendored and first.endswith(".dist-info"):
        first = "*.dist-info"
    first = first.removesuffix(".py")
    return f"python_modules/{first}" if vendored else first


def dry_run(outdir: Path, config: Path = PROJECT / "wrangler.toml") -> Bundle:
    """Build the deploy bundle into `outdir` (offline) and read wrangler's totals."""
    output = wrangler(["deploy", "--dry-run", "--outdir", str(outdir), "--config", str(config)])
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
        entry=Path(tomllib.loads(config.read_text())["main"]).name,  # at the bundle's root
        upload_kib=float(totals.group(1)),
        gzip_kib=float(totals.group(2)),
        worker_files=tuple(f for f in files if not f.startswith("python_modules/")),
        vendored_files=tuple(f for f in files if f.startswith("python_modules/")),
    )


def check_vars(config: Path, extra: dict[str, str]) -> dict[str, str]:
    """The Worker's settings when served from its bundle: `[vars]`, a token, the offline
    model, and every empty `*_URL` setting pointed at a local server answering 200 {}
    (ECHO)."""
    settings = {k: str(v) for k, v in tomllib.loads(config.read_text()).get("vars", {}).items()}
    settings.update({"API_TOKEN": "bundle-check", "LLM_PROVIDER": "demo"})
    for name, value in settings.items():
        if name.endswith("_URL") and name != "LLM_BASE_URL" and not value.strip():
            settings[name] = ECHO
    settings.update(extra)
    return settings


def bundle_project(bundle: Bundle, config: Path, project: Path, variables: dict[str, str]) -> Path:
    """A Worker project in `project` made of the bundle alone: worker/ (the bundle's
    modules), python_modules/ (a link to the bundle's) and wrangler.json (from `config`:
    its name, flags, bindings, python_modules excludes, and `variables` as [vars]; D1's
    migrations from the config's folder, so the dev server applies them)."""
    for file in bundle.worker_files:
        (project / "worker" / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bundle.outdir / file, project / "worker" / file)
    kept = (*RUNTIME_FIELDS, "name", "durable_objects", "migrations", "d1_databases",
            "kv_namespaces", "rules")  # fmt: skip
    return scratch_worker(
        project, f"worker/{bundle.entry}", config=config, kept=kept,
        python_modules=bundle.outdir / "python_modules", vars=variables,
    )  # fmt: skip


class _Echo(http.server.BaseHTTPRequestHandler):
    """200 {} to any request; each one's method and path kept in `server.seen`."""

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.server.seen.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class Answer:
    """The Worker's answer to one request: its status, body and time."""

    status: int
    raw: bytes
    ms: float

    def json(self) -> dict[str, Any]:
        """The body as JSON (an object), or `{"raw": text}` for a body that is none."""
        try:
            body = json.loads(self.raw)
        except ValueError:
            body = None
        return body if isinstance(body, dict) else {"raw": self.raw.decode(errors="replace")}


@dataclass
class BundleServer:
    """The Worker served from its bundle alone (`serve_bundle`), while inside it."""

    server: DevServer
    token: str  # the API token (`check_vars`'s)
    echoed: list[str] = field(default_factory=list)  # the requests ECHO answered

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def start_s(self) -> float:
        return self.server.start_s

    @property
    def output(self) -> str:
        return self.server.output

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Answer:
        """`method path` with the API token, `body` as JSON (None: no body)."""
        sent = {"authorization": f"Bearer {self.token}", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("content-type", "application/json")
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method, headers=sent
        )
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            with error:
                status, raw = error.code, error.read()
        return Answer(status, raw, (time.perf_counter() - t0) * 1000)


@contextlib.contextmanager
def serve_bundle(bundle: Bundle, config: Path, variables: dict[str, str]) -> Iterator[BundleServer]:
    """The Worker served from its bundle alone (`bundle_project`) by the dev server, with
    `variables` as its settings (ECHO ones pointed at a local server answering 200 {}),
    while inside. Its D1 and objects live in a scratch folder, gone after."""
    echo = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    echo.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    echo_url = f"http://127.0.0.1:{echo.server_address[1]}"
    env = {k: echo_url if v == ECHO else v for k, v in variables.items()}
    try:
        with tempfile.TemporaryDirectory(prefix="bundle-check-") as scratch:
            worker = bundle_project(bundle, config, Path(scratch) / "project", env)
            state, none = Path(scratch) / "state", Path(scratch) / "no.dev.vars"
            args = ["--config", str(worker), "--persist-to", str(state), "--dev-vars", str(none)]
            with DevServer(args) as server:
                yield BundleServer(server, env["API_TOKEN"], echo.seen)  # type: ignore[attr-defined]
    finally:
        echo.shutdown()
        echo.server_close()


def run_from_bundle(
    bundle: Bundle, config: Path, variables: dict[str, str], message: str = "triage issue 42"
) -> dict[str, Any]:
    """Serve the Worker from its bundle alone (`serve_bundle`) and send it one turn
    (`POST /sessions/bundle-check/messages`). What it did: `start_s` (the dev server's
    `started in`), `status` and `body` of the answer, `turn_ms`, `echoed` (the requests
    its tools sent to ECHO), and `output` (the server's log)."""
    with serve_bundle(bundle, config, variables) as served:
        turn = served.request("POST", TURN_PATH, {"message": message})
    return turn_result(served, turn)


def turn_result(served: BundleServer, turn: Answer) -> dict[str, Any]:
    """`run_from_bundle`'s answer, from the server (stopped: its whole log) and the turn."""
    return {
        "start_s": served.start_s,
        "status": turn.status,
        "body": turn.json(),
        "turn_ms": round(turn.ms, 1),
        "echoed": list(served.echoed),
        "output": served.output,
    }


def added_packages(pyproject: Path = PROJECT / "pyproject.toml") -> list[str]:
    """The requirements of `[project].dependencies` beyond the template's: yours."""
    requirements = tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", [])
    names = [re.split(r"[^A-Za-z0-9._-]", str(r).strip(), maxsplit=1)[0] for r in requirements]
    normal = [re.sub(r"[._-]+", "-", name).lower() for name in names if name]
    return sorted(set(normal) - KIT_REQUIREMENTS)


def default_limit(pyproject: Path = PROJECT / "pyproject.toml") -> float:
    """The limit a bundle is checked against: the template's budget (LIMIT_KIB), or, once
    you added packages (`added_packages`), Cloudflare's free plan's (3 MB)."""
    return FREE_PLAN_KIB if added_packages(pyproject) else LIMIT_KIB


def measure(bundle: Bundle, limit_kib: float) -> dict[str, Any]:
    """What main prints of `bundle`: wrangler's totals, the limit's check, the largest parts."""
    return {
        "upload_kib": bundle.upload_kib,
        "gzip_kib": bundle.gzip_kib,
        "limit_kib": limit_kib,
        "within_limit": bundle.gzip_kib <= limit_kib,
        "worker_modules": len(bundle.worker_files),
        "worker_kib": round(bundle.size(bundle.worker_files) / 1024, 1),
        "vendored_files": len(bundle.vendored_files),
        "vendored_kib": round(bundle.size(bundle.vendored_files) / 1024, 1),
        "top": [
            {"part": name, "kib": round(raw / 1024, 1), "gzip_kib": round(gz / 1024, 1)}
            for name, raw, gz in bundle.contributors()[:TOP]
        ],
    }


def limit_line(gzip_kib: float, limit_kib: float) -> str:
    """Whether `gzip_kib` is within `limit_kib`, in words."""
    verdict = "within" if gzip_kib <= limit_kib else "OVER"
    return (
        f"gzip {gzip_kib:,.0f} KiB: {verdict} the limit of {limit_kib:,.0f} KiB "
        f"({gzip_kib / limit_kib:.0%}; Cloudflare's free plan takes {FREE_PLAN_KIB:,} KiB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=PROJECT / "wrangler.toml")
    parser.add_argument("--outdir", type=Path, help="keep the bundle here (default: a temp dir)")
    parser.add_argument(
        "--import-time", action="store_true", help="start the Worker from the bundle alone, timed"
    )
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--limit-kib", type=float, help="gzipped (default: default_limit)")
    parser.add_argument("--json", action="store_true", help="print one line of JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bundle-") as scratch:
        bundle = dry_run(args.outdir or Path(scratch) / "dist", args.config.resolve())
        report = measure(bundle, args.limit_kib or default_limit())
        if args.import_time:
            extra = dict(v.split("=", 1) for v in args.var)
            ran = run_from_bundle(bundle, args.config, check_vars(args.config, extra))
            report["start_s"] = ran["start_s"]
            report["turn"] = {
                "status": ran["status"], "body_status": ran["body"].get("status"),
                "ms": ran["turn_ms"],
            }  # fmt: skip
            if ran["status"] != 200:
                print(ran["output"][-4000:], file=sys.stderr)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report, bundle)
    return 0 if report["within_limit"] else 1


def print_report(report: dict[str, Any], bundle: Bundle) -> None:
    print(
        f"upload {report['upload_kib']:.0f} KiB, gzip {report['gzip_kib']:.0f} KiB "
        f"(wrangler's figures); the Worker's own modules: {report['worker_modules']} files, "
        f"{report['worker_kib']} KiB; python_modules/: {report['vendored_files']} files, "
        f"{report['vendored_kib']} KiB"
    )
    print(limit_line(report["gzip_kib"], report["limit_kib"]))
    print(f"the {TOP} largest parts (each gzipped alone):")
    for part in report["top"]:
        print(f"  {part['gzip_kib']:7.1f} KiB gzip {part['kib']:8.1f} KiB  {part['part']}")
    print("the Worker's own files:")
    for file in bundle.worker_files:
        print(f"  {file}")
    if "turn" in report:
        turn = report["turn"]
        print(
            f"the Worker from the bundle alone, on workerd (scripts/dev --config): started in "
            f"{report['start_s']:.1f} s (wrangler, workerd, Pyodide, the Worker's imports); "
            f"a turn served from it: HTTP {turn['status']} {turn['body_status']} "
            f"in {turn['ms']:.0f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
