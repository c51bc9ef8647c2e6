"""One turn of the Worker built from your agent: its deploy bundle served alone on workerd.

    .venv/bin/python runtime/agent_turn.py [--agent src/agent.py] [--message TEXT]

What a deploy uploads (`wrangler deploy --dry-run`, scripts/bundle_size.py), served as a
Worker of its own by `scripts/dev --config` on real workerd, offline, and sent one turn
(`POST /sessions/bundle-check/messages`) with the offline model (LLM_PROVIDER=demo: your
`make_llm`'s, or `TestLLM`, which calls each tool once). Your agent's upstreams answer from
this process, over real HTTP: a setting of `DEV_STUBS` by its stub (an `mcp_stub` too), a
setting a toolset reads without a stub by an MCP server with no tools, any other `*_URL`
setting of the agent by `200 {}`. The turn must end `complete` or `awaiting_approval`.
`scripts/check` runs it. `serve_agent` keeps such a Worker served for more requests:
tests/test_bundle.py sends one built with tests/agents/bundle_paths.py down every path
the bundle keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import inspect
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1] / "scripts"),
]
import bundle_size  # noqa: E402 - scripts/: the deploy bundle
from agent_checks import PROJECT, load_agent, toolset_settings  # noqa: E402 - runtime/

ANSWERS = ("complete", "awaiting_approval")


@dataclass(frozen=True)
class Upstreams:
    """What answers the agent's settings during the turn: `stubs` by name (a DevStub),
    `empty_mcp` the names served by an MCP server with no tools, `echo` those answered
    200 {}, `tokens` toolset settings that are not URLs (given a placeholder)."""

    stubs: Mapping[str, Callable[..., Any]]
    empty_mcp: tuple[str, ...]
    echo: tuple[str, ...]
    tokens: tuple[str, ...]

    @classmethod
    def of(cls, agent: Any) -> Upstreams:
        """The upstreams of an agent module (`AgentModule`, as load_agent returns it)."""
        stubs = dict(agent.dev_stubs)
        toolsets = toolset_settings(agent)
        urls = {getattr(t, "url_setting", None) for t in agent.agent.toolsets}
        empty_mcp = tuple(n for n in toolsets if n in urls and n not in stubs)
        tokens = tuple(n for n in toolsets if n not in urls and n not in stubs)
        echo = tuple(
            n for n in agent.settings if n.endswith("_URL") and n not in stubs and n not in toolsets
        )
        return cls(stubs, empty_mcp, echo, tokens)

    def settings(self, base: str) -> dict[str, str]:
        """Each setting's value with the upstreams served at `base`."""
        names = [*self.stubs, *self.empty_mcp, *self.echo]
        return {
            **{name: f"{base}/{name}" for name in names},
            **dict.fromkeys(self.tokens, "bundle-check"),
        }


def _empty_mcp() -> Callable[..., Any]:
    from durable_agents.mcp import mcp_stub

    return mcp_stub()


@contextmanager
def serving(upstreams: Upstreams) -> Iterator[str]:
    """The upstreams served on 127.0.0.1 (a thread of this process) while inside; their
    base URL. A request to `<base>/<NAME>/<path>` goes to NAME's stub with `/<path>`."""
    empty = _empty_mcp() if upstreams.empty_mcp else None
    answer_by = {**dict.fromkeys(upstreams.empty_mcp, empty), **upstreams.stubs}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            name, _, rest = self.path.lstrip("/").partition("/")
            name, _, query = name.partition("?")
            path = "/" + rest + (f"?{query}" if query else "")
            stub = answer_by.get(name)
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, reply = 200, {}
            if stub is not None:
                status, reply = _call(stub, self.command, path, body, headers)
            data = b"" if reply is None else json.dumps(reply).encode()
            self.send_response(status)
            if data:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _call(
    stub: Callable[..., Any], method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any]:
    answer = stub(method, path, body, headers)
    if inspect.isawaitable(answer):
        answer = asyncio.run(_awaited(answer))
    status, reply = answer
    return int(status), reply


async def _awaited(answer: Any) -> Any:
    return await answer


@contextmanager
def _built_with(agent_file: Path) -> Iterator[None]:
    """The build wrangler runs (scripts/build_worker.py) stages `agent_file` as the agent."""
    before = os.environ.get("DURABLE_AGENTS_AGENT")
    os.environ["DURABLE_AGENTS_AGENT"] = str(agent_file)
    try:
        yield
    finally:
        if before is None:
            del os.environ["DURABLE_AGENTS_AGENT"]
        else:
            os.environ["DURABLE_AGENTS_AGENT"] = before


@contextmanager
def serve_agent(
    agent_file: Path = PROJECT / "src" / "agent.py",
    config: Path = PROJECT / "wrangler.toml",
    bundle: bundle_size.Bundle | None = None,
    settings: Mapping[str, str] | None = None,
) -> Iterator[tuple[bundle_size.BundleServer, bundle_size.Bundle]]:
    """The deploy bundle built with `agent_file` as the agent (`bundle`, else built now)
    served alone, its upstreams answered from this process, while inside: the server and
    the bundle. `settings` are given the Worker last (LLM_PROVIDER=openai, say)."""
    upstreams = Upstreams.of(load_agent(agent_file))
    with tempfile.TemporaryDirectory(prefix="agent-turn-") as scratch:
        if bundle is None:
            with _built_with(agent_file):
                bundle = bundle_size.dry_run(Path(scratch) / "dist", config)
        with serving(upstreams) as base:
            extra = {**upstreams.settings(base), **(settings or {})}
            variables = bundle_size.check_vars(config, extra)
            with bundle_size.serve_bundle(bundle, config, variables) as served:
                yield served, bundle


def agent_turn(
    agent_file: Path = PROJECT / "src" / "agent.py",
    config: Path = PROJECT / "wrangler.toml",
    message: str = "triage issue 42",
    bundle: bundle_size.Bundle | None = None,
) -> dict[str, Any]:
    """Serve the deploy bundle built with `agent_file` as the agent (`serve_agent`) and
    send it one turn: bundle_size.run_from_bundle's answer, with `bundle`."""
    with serve_agent(agent_file, config, bundle) as (served, built):
        turn = served.request("POST", bundle_size.TURN_PATH, {"message": message})
    return {**bundle_size.turn_result(served, turn), "bundle": built}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", type=Path, default=PROJECT / "src" / "agent.py")
    parser.add_argument("--message", default="triage issue 42")
    args = parser.parse_args(argv)
    agent_file = args.agent.resolve()
    ran = agent_turn(agent_file, message=args.message)
    body, bundle = ran["body"], ran["bundle"]
    shown = agent_file.relative_to(PROJECT) if agent_file.is_relative_to(PROJECT) else agent_file
    ok = ran["status"] == 200 and body.get("status") in ANSWERS
    print(
        f"the Worker built from {shown} (its deploy bundle, {bundle.gzip_kib:.0f} KiB "
        f"gzipped) on workerd: started in {ran['start_s']:.1f} s; one turn: HTTP "
        f"{ran['status']} {body.get('status')}, {body.get('steps')} steps, "
        f"{ran['turn_ms']:.0f} ms"
    )
    if not ok:
        print(json.dumps(body)[:2000], file=sys.stderr)
        print(ran["output"][-4000:], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
