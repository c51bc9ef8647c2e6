#!/usr/bin/env python3
"""Benchmark: how fast `scripts/dev` starts and reloads, against a minimal Python Worker.

    .venv/bin/python scripts/bench_dev_start.py [--rounds 5] [--also DIR]

Round after round, alternating (which one goes first alternates too), on this machine:

- the kit: `scripts/dev` serving this project's Worker with the triage example's agent
  (a copy in a scratch folder: its offline model, its dev stubs), on a state dir whose
  D1 is up to date (a first, untimed start migrated it): a developer's restart;
- a minimal Python Worker: hello world (`workers.Response`) with the same python_modules/,
  compatibility date and flags (the development bundle's too, and its baseline snapshot,
  as runtime/dev.py gives them), served by `wrangler dev` alone (scripts/wrangler) from a
  scratch folder (dev_process.scratch_worker).

Start: from starting the process to its ready line (dev.py's `dev: ready on`, wrangler's
`Ready on`), and the CPU its processes used by then (Linux' /proc); then the first answer
(the kit: a "hi" turn; the minimal Worker: GET /). Reload: from an edit (the agent file's
offline reply; the minimal Worker's answer) to the first request answered by the edited
code, polled every 50 ms (a kit's poll is a turn, ~50-150 ms). Prints each round, the
medians and the ratios against the target (issue 33: start and reload within 1.2x of the
minimal Worker's). `--also DIR`: another checkout of the kit (e.g. main's, made with
`git worktree add`), measured in the same rounds, for a before/after side by side.

Needs the runtime (`scripts/setup-runtime`); run with the project's .venv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
import dev  # runtime/dev.py: the flags and snapshot scripts/dev gives workerd
from dev_process import PROJECT, DevServer, WranglerDev, scratch_worker  # a sibling script

TARGET = 1.2
TOKEN = "bench-token"
AGENT = PROJECT / "examples" / "triage" / "agent.py"
# The triage agent's offline answer to "hello": an edit of it is what a reload must serve.
REPLY = "I am the offline triage model."
MINIMAL = '''"""A minimal Python Worker: the baseline scripts/bench_dev_start.py starts."""

from workers import Response, WorkerEntrypoint

VERSION = "v0"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response(VERSION)
'''


def request(url: str, data: dict[str, Any] | None = None, timeout: float = 30) -> str:
    """The body of a GET (or, with `data`, an authorised JSON POST) to `url`."""
    body = json.dumps(data).encode() if data is not None else None
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    call = urllib.request.Request(url, data=body, headers=headers)
    with urllib.request.urlopen(call, timeout=timeout) as response:
        return str(response.read().decode())


def poll(answer: Callable[[], str], wanted: str, limit: float = 120) -> float:
    """Seconds until `answer()` holds `wanted` (an answer that fails counts as not yet)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        with contextlib.suppress(OSError, urllib.error.HTTPError, ValueError):
            if wanted in answer():
                return time.perf_counter() - started
        time.sleep(0.05)
    raise SystemExit(f"bench: {wanted!r} was not served within {limit:.0f} s")


def group_cpu(group: int) -> float:
    """CPU seconds (user and system, with their waited-for children's) of the processes in
    process group `group` now (Linux: /proc)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == group:
                total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Contender:
    """One Worker measured round after round: how to start it, ask it, and edit it."""

    name: str
    server: Callable[[], DevServer]
    ask: Callable[[str, int], str]  # (url, n): an answer of the Worker as it is now
    edit: Callable[[int], str]  # the n-th edit of its source; what it then answers with
    starts: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    reloads: list[float] = field(default_factory=list)

    def round(self, n: int) -> str:
        server = self.server()
        try:
            server.start()
            self.starts.append(server.ready_s)
            assert server.process is not None
            self.cpus.append(group_cpu(server.process.pid))  # its own group: see DevServer
            self.firsts.append(poll(lambda: self.ask(server.url, 0), ""))
            wanted = self.edit(n)
            self.reloads.append(poll(lambda: self.ask(server.url, n), wanted))
        finally:
            server.stop()
        return (
            f"{self.name}: start {self.starts[-1]:.2f} s ({self.cpus[-1]:.1f} s CPU; first answer "
            f"+{self.firsts[-1]:.2f} s), "
            f"reload {self.reloads[-1]:.2f} s"
        )


def kit(name: str, project: Path, scratch: Path) -> Contender:
    """scripts/dev of `project` serving a copy of the triage agent, on a migrated state."""
    scratch.mkdir()
    agent = scratch / "agent.py"
    shutil.copy2(AGENT, agent)
    original = agent.read_text()
    if REPLY not in original:
        raise SystemExit(f"bench: {AGENT} no longer answers {REPLY!r}")
    args = ["--persist-to", str(scratch / "state"), "--dev-vars", str(scratch / "none"),
            "--agent", str(agent)]  # fmt: skip

    def server() -> DevServer:
        return DevServer(args, env={"API_TOKEN": TOKEN}, project=project)

    def ask(url: str, n: int) -> str:
        return request(f"{url}/sessions/bench-{n}-{time.time_ns()}/messages", {"message": "hi"})

    def edit(n: int) -> str:
        wanted = f"{REPLY[:-1]}, edit {n}."
        agent.write_text(original.replace(REPLY, wanted))
        return wanted

    with server() as first:  # untimed: applies the D1 migrations to the fresh state
        print(f"{name}: first start on fresh state {first.ready_s:.2f} s", flush=True)
    return Contender(name, server, ask, edit)


def minimal(scratch: Path) -> Contender:
    """The hello-world Worker under `wrangler dev` alone, as runtime/dev.py would run it."""
    config_file = PROJECT / "wrangler.toml"
    bundle = dev.bundle_choice()
    flags = dev.compatibility_flags(config_file, dev.read_config(config_file), bundle)
    project = scratch / "project"
    config = scratch_worker(project, "worker/entry.py", name="minimal-python-worker")
    entry = project / "worker" / "entry.py"
    entry.parent.mkdir()
    entry.write_text(MINIMAL)

    def server() -> DevServer:
        port = dev.free_port("127.0.0.1")
        args = [
            "--config", str(config), "--ip", "127.0.0.1", "--port", str(port),
            "--inspector-port", str(dev.free_port("127.0.0.1", avoid=port)),
            "--persist-to", str(scratch / "state"), "--show-interactive-dev-session=false",
            "--compatibility-flags", *flags,
        ]  # fmt: skip
        return WranglerDev(args, env=dev.snapshot_env(bundle), project=project)

    def edit(n: int) -> str:
        entry.write_text(MINIMAL.replace('"v0"', f'"v{n}"'))
        return f"v{n}"

    with server():  # untimed, as the kit's first start
        pass
    return Contender("minimal Worker", server, lambda url, n: request(f"{url}/"), edit)


def ratio_line(what: str, kits: list[Contender], base: Contender, values: str) -> str:
    """The medians of `values` and each kit's ratio to the minimal Worker's; for start and
    reload, whether this checkout's kit (the first) is within TARGET."""

    def median(contender: Contender) -> float:
        return float(statistics.median(getattr(contender, values)))

    parts = [f"{c.name} {median(c):.2f} s ({median(c) / median(base):.2f}x)" for c in kits]
    line = f"{what}: {', '.join(parts)}; {base.name} {median(base):.2f} s"
    if values in ("cpus", "firsts"):
        return line
    met = median(kits[0]) / median(base) <= TARGET
    return f"{line} (target: within {TARGET}x: {'met' if met else 'not met'})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--also", type=Path, help="another checkout of the kit, measured too")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-dev-start-") as scratch:
        root = Path(scratch)
        kits = [kit("kit", PROJECT, root / "kit")]
        if args.also:
            kits.append(kit(f"kit ({args.also})", args.also.resolve(), root / "also"))
        base = minimal(root / "minimal")
        contenders = [*kits, base]
        for n in range(1, args.rounds + 1):
            order = contenders if n % 2 else contenders[::-1]
            print(f"round {n}: " + "; ".join(c.round(n) for c in order), flush=True)
            time.sleep(1)  # the last workerd's exit settles
    print(f"medians of {args.rounds} rounds, alternating:")
    print("  " + ratio_line("start to ready", kits, base, "starts"))
    print("  " + ratio_line("CPU to ready (its processes)", kits, base, "cpus"))
    print("  " + ratio_line("first answer after ready", kits, base, "firsts"))
    print("  " + ratio_line("reload after an edit", kits, base, "reloads"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
