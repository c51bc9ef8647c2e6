"""WORKERS_PLAN (issue 20, item 5): `scripts/dev` enforces Cloudflare's per-invocation limits
of the plan, free (the default) or paid, on the Worker it serves, with Cloudflare's errors.

Over HTTP against the probe Worker tests/workers/limits/ (served by `runtime/dev.py
--config`, as `scripts/dev --config`), once under free and once under paid (the two servers
start together, once for the module), and against this kit's Worker (`scripts/dev --agent`,
an agent whose tool makes 60 fetches in one turn). Every fetch goes to a local HTTP server
on 127.0.0.1 that counts the requests of each `group` and how many were open at once.
The CPython tests at the end read the setting and stage the kit's Worker.

Needs `scripts/setup-runtime` (node_modules/, the pinned Node and python_modules/).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import ServedWorker

from durable_agents.testing.worker import DevWorker

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "workers" / "limits" / "wrangler.toml"
# Cloudflare's errors, word for word.
LIMITS = (
    "To configure this limit, refer to "
    "https://developers.cloudflare.com/workers/wrangler/configuration/#limits"
)
SUBREQUESTS = f"Too many subrequests by single Worker invocation. {LIMITS}"
API_REQUESTS = f"Too many API requests by single Worker invocation. {LIMITS}"


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dev_limits = _load("dev_limits", ROOT / "runtime" / "dev_limits.py")
build_worker = _load("build_worker", ROOT / "scripts" / "build_worker.py")


class Target:
    """A local HTTP server: 200 "ok" after `?delay=` s; per `?group=`, the requests it got
    and the most it had open at once."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.open: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)
        lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                group = query.get("group", [""])[0]
                delay = float(query.get("delay", ["0"])[0])
                with lock:
                    target.counts[group] += 1
                    target.open[group] += 1
                    target.most[group] = max(target.most[group], target.open[group])
                time.sleep(delay)
                with lock:
                    target.open[group] -= 1
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def at(self, group: str, delay: float = 0) -> str:
        return f"{self.url}?group={group}&delay={delay}"


class Probe(ServedWorker):
    def get(self, path: str, **query: object) -> Any:
        url = f"{self.origin}{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=120) as response:
            return json.loads(response.read())


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    served = Target()
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Probe]]:
    state = tmp_path_factory.mktemp("limits")
    env = {k: v for k, v in os.environ.items() if k != "WORKERS_PLAN"}
    servers = {
        "free": Probe(PROBE, state / "free", env),  # the default
        "paid": Probe(PROBE, state / "paid", {**env, "WORKERS_PLAN": "paid"}),
    }
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready(240)
        yield servers
    finally:
        for server in servers.values():
            server.kill()


@pytest.mark.slow
def test_the_banner_says_the_plan(probes: dict[str, Probe]) -> None:
    free, paid = probes["free"].output, probes["paid"].output
    assert "dev: WORKERS_PLAN=free (the default): per invocation at most 50 subrequests, " in free
    assert "dev: WORKERS_PLAN=paid (environment): per invocation at most 10,000 subr" in paid


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("js", f"#51: JsException: Error: {SUBREQUESTS}"),  # js.fetch, as FetchTransport
        ("bound", f"#51: JsException: Error: {SUBREQUESTS}"),  # `from js import fetch`
        ("seq", f"#51: AbortError: {SUBREQUESTS}"),  # workers.fetch (pyodide's pyfetch)
    ],
)
def test_60_fetches_in_one_request_free_refuses_the_51st_paid_serves_them(
    probes: dict[str, Probe], target: Target, mode: str, error: str
) -> None:
    free = probes["free"].get("/fetch", n=60, target=target.at(f"free-{mode}"), mode=mode)
    assert free == {"ok": 50, "errors": 10, "first_error": error}
    assert target.counts[f"free-{mode}"] == 50  # the refused ones never left the Worker
    paid = probes["paid"].get("/fetch", n=60, target=target.at(f"paid-{mode}"), mode=mode)
    assert paid == {"ok": 60, "errors": 0, "first_error": None}
    assert target.counts[f"paid-{mode}"] == 60


@pytest.mark.slow
def test_the_budget_is_per_invocation_and_6_connections_open_at_once(
    probes: dict[str, Probe], target: Target
) -> None:
    free = probes["free"]
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(
                lambda group: free.get(
                    "/fetch", n=30, target=target.at(group, delay=0.2), mode="gather"
                ),
                ["both-1", "both-2"],
            )
        )
    assert answers == [{"ok": 30, "errors": 0, "first_error": None}] * 2
    # 30 at once in each request: 6 of them open at a time (the others waited, not failed)
    assert (target.most["both-1"], target.most["both-2"]) == (6, 6)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["run", "batch"])
def test_d1_free_refuses_the_51st_query_of_an_invocation(
    probes: dict[str, Probe], how: str
) -> None:
    free = probes["free"].get("/d1", n=60, how=how)  # a batch (of two statements) is one
    error = f"#51: JsException: Error: {API_REQUESTS}"
    assert free == {"ok": 50, "errors": 10, "first_error": error}
    assert probes["paid"].get("/d1", n=60, how=how) == {"ok": 60, "errors": 0, "first_error": None}


@pytest.mark.slow
def test_each_request_to_a_durable_object_has_a_budget_of_its_own(
    probes: dict[str, Probe], target: Target
) -> None:
    # One Worker request, two requests to the object of 40 fetches each: 80 in all, and
    # each of the object's invocations within free's 50.
    answers = probes["free"].get("/do", n=40, calls=2, target=target.at("do"))
    assert answers == [{"ok": 40, "errors": 0, "first_error": None}] * 2
    assert target.counts["do"] == 80
    (over,) = probes["free"].get("/do", n=60, calls=1, target=target.at("do-over"))
    assert over == {"ok": 50, "errors": 10, "first_error": f"#51: AbortError: {SUBREQUESTS}"}


FETCHING_AGENT = """
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, ToolCall, ToolContext, tool
from durable_agents.llm.offline import FunctionLLM
from durable_agents.llm.settings import setting

SETTINGS = ("TARGET_URL",)


@dataclass
class Deps:
    url: str
    http: httpx.AsyncClient


class Count(BaseModel):
    n: int


@tool(safe_to_retry=True)
async def fetch_many(args: Count, ctx: ToolContext[Deps]) -> dict[str, Any]:
    \"\"\"GET the target n times, one after another.\"\"\"
    ok, first_error = 0, None
    for i in range(args.n):
        try:
            (await ctx.deps.http.get(ctx.deps.url)).raise_for_status()
            ok += 1
        except httpx.HTTPError as exc:
            first_error = first_error or f"#{i + 1}: {type(exc).__name__}: {exc}"
    return {"ok": ok, "first_error": first_error}


AGENT = Agent("fetcher", "Fetch.", [fetch_many], deps_type=Deps)


def make_deps(env, http):
    return Deps(str(setting(env, "TARGET_URL")), http)


def answer(messages, tools):
    if messages[-1].role == "user":
        return LLMResponse("", [ToolCall("fetch-60", "fetch_many", {"n": 60})])
    return LLMResponse(messages[-1].content)


def make_llm(env):
    return FunctionLLM(answer)
"""


@pytest.mark.slow
def test_the_kits_worker_free_refuses_a_tools_51st_fetch(target: Target, tmp_path: Path) -> None:
    agent = tmp_path / "fetching_agent.py"
    agent.write_text(FETCHING_AGENT)
    worker = DevWorker(ROOT, tmp_path / "state", {"TARGET_URL": target.at("kit")}, agent=agent)
    try:
        worker.start()
        assert "dev: WORKERS_PLAN=free ([vars]): per invocation" in "\n".join(worker.lines)
        reply = worker.post("/sessions/sixty/messages", {"message": "fetch"}, timeout=120)
    finally:
        worker.close()
    assert reply.status == 200, reply.text
    assert json.loads(reply.body["response"]) == {
        "ok": 50,
        "first_error": f"#51: InvocationLimitError: Error: {SUBREQUESTS}",
    }
    assert target.counts["kit"] == 50


# --- on CPython: the setting, and the kit's Worker staged for a dev server ---


def test_the_plan_is_read_like_the_settings_free_by_default() -> None:
    read = dev_limits.read_plan
    assert read({}, {}, {}) == ("free", "the default")
    assert read({"WORKERS_PLAN": "paid"}, {}, {}) == ("paid", "[vars]")
    assert read({"WORKERS_PLAN": "paid"}, {"WORKERS_PLAN": "free"}, {}) == ("free", ".dev.vars")
    assert read({}, {"WORKERS_PLAN": "free"}, {"WORKERS_PLAN": "paid"}) == ("paid", "environment")
    with pytest.raises(ValueError, match="WORKERS_PLAN must be free or paid, not 'pro'"):
        read({}, {}, {"WORKERS_PLAN": "pro"})
    assert dev_limits.plan_limits("paid", {"limits": {"subrequests": 20_000}})["subrequests"] == (
        20_000
    )
    assert dev_limits.plan_limits("free", {"limits": {"subrequests": 20_000}})["subrequests"] == 50
    assert dev_limits.plan_limits("free", {}) == {
        "subrequests": 50, "d1": 50, "services": 1000, "connections": 6,
    }  # fmt: skip


def test_an_unknown_plan_stops_the_server_before_it_starts(tmp_path: Path) -> None:
    env = {**os.environ, "WORKERS_PLAN": "enterprise", "PYODIDE_BUNDLE": "development"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "runtime" / "dev.py"), "--config", str(PROBE),
         "--persist-to", str(tmp_path / "state"), "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "dev: WORKERS_PLAN must be free or paid, not 'enterprise' (from environment)" in (
        done.stderr
    )


def test_the_kits_worker_is_staged_for_the_dev_server_with_the_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = ROOT / "build" / "worker" / "entry.py"
    monkeypatch.setattr(dev_limits, "process_alive", lambda pid: True)
    stage = dev_limits.Stage(tmp_path, main, dev_limits.PLANS["free"], is_kit=True)
    try:
        assert stage.env() == {"DURABLE_AGENTS_DEV_STAGE": str(stage.dir)}
        monkeypatch.setenv("DURABLE_AGENTS_DEV_STAGE", str(stage.dir))
        assert build_worker.main([]) == 0
        staged = {p.name for p in stage.worker.iterdir()}
        assert {"entry.py", "agent.py", "durable_agents"} <= staged
        assert {"_workers_plan.py", "_workers_plan.wasm", "_workers_plan_main.py"} <= staged
        assert "_worker = importlib.import_module('entry')" in stage.main.read_text()
        assert stage.main.parent == stage.worker
    finally:
        stage.close()
    assert not stage.dir.exists()
