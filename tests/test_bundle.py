"""The Worker's deploy bundle holds only what the Worker needs, fits its budget, and every
path the kit has runs from it alone.

The bundle is what `wrangler deploy --dry-run --outdir DIR` makes, offline
(wrangler.toml's `[build]` stages the Worker's modules with scripts/build_worker.py
first, the kit's bare; its `[python_modules] exclude` leaves out the vendored files the
Worker never reads). Its gzipped size, wrangler's figure, is held to the template's
budget (scripts/bundle_size.py's `default_limit`). The Worker is then served from that
folder alone, on real workerd (`scripts/dev --config` on a project holding only the
bundle: runtime/agent_turn.py), built with tests/agents/bundle_paths.py as its agent,
and run down every path the bundle keeps: a model adapter streaming over `fetch`, the
Worker's HTTP client, MCP tools, schedules fired by the session's alarm, a turn streamed
to its client, the cron, the pages. So an exclusion one of them needs fails here. Needs
`scripts/setup-runtime`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.support.llm_support import Reply, ScriptedServer, sse

PROJECT = Path(__file__).resolve().parents[1]
CONFIG = PROJECT / "wrangler.toml"
PATHS_AGENT = PROJECT / "tests" / "agents" / "bundle_paths.py"


def _script(name: str) -> ModuleType:
    return _module(name, PROJECT / "scripts" / f"{name}.py")


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build_worker = _script("build_worker")
bundle_size = _script("bundle_size")
agent_turn = _module("agent_turn", PROJECT / "runtime" / "agent_turn.py")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The template's deploy bundle: src/agent.py as the agent."""
    return bundle_size.dry_run(tmp_path_factory.mktemp("bundle") / "dist", CONFIG)


def test_the_bundle_holds_the_workers_modules_and_nothing_else(bundle: Any) -> None:
    assert bundle.worker_modules == set(build_worker.worker_modules())
    assert {
        "entry",
        "agent",
        "durable_agents",
        "durable_agents.run",
        "durable_agents.stores.base",
        "durable_agents.cloudflare.routes",
        "durable_agents.stores.d1",
        "durable_agents.cloudflare.fetch_transport",
        "durable_agents.llm.settings",
    } <= bundle.worker_modules
    not_for_the_worker = re.compile(
        r"(^|/)(testing|tests|examples)/|(^|/)cli\.py$|stores/(sqlite|postgres|_postgres_sql)\.py$"
        r"|egg-info|\.txt$"
    )
    assert [f for f in bundle.worker_files if not_for_the_worker.search(f)] == []
    # Modules, and the package data build_worker stages beside them (the schema's
    # migrations): nothing else.
    staged = build_worker.worker_modules()
    data = {target.as_posix() for target in build_worker.data_files(staged)}
    assert {f for f in bundle.worker_files if not f.endswith(".py")} == data
    assert "durable_agents/stores/migrations/0001_init.sql" in data
    # Left out by wrangler.toml's [python_modules] exclude (why: its comments); the
    # Worker runs without them in the last test.
    left_out = re.compile(
        r"^python_modules/(pydantic/v1/|(anyio|certifi|httpcore|h11)/|[^/]+\.dist-info/"
        r"|idna/uts46data\.py$|workers/[aw]sgi\.py$)|\.pyi$|\.pyc$"
    )
    assert [f for f in bundle.vendored_files if left_out.search(f)] == []
    assert {
        "python_modules/pydantic_core/core_schema.py",
        "python_modules/pydantic/json_schema.py",
        "python_modules/httpx/_transports/default.py",  # httpx imports it (its transports)
        "python_modules/idna/idnadata.py",
        "python_modules/workers/entrypoints.py",
        "python_modules/_workers_sdk_patch_loader.pth",
    } <= set(bundle.vendored_files)


def test_the_bundle_is_within_its_budget(bundle: Any) -> None:
    # wrangler's gzipped total, the figure Cloudflare's limits apply to (3 MB on the free
    # plan): the template's is held to two thirds of that, the rest left to the packages
    # you add; once you added some, the free plan's limit holds (bundle_size.default_limit).
    limit = bundle_size.default_limit()
    assert bundle.gzip_kib <= limit, (
        f"{bundle_size.limit_line(bundle.gzip_kib, limit)}; packages you added: "
        f"{', '.join(bundle_size.added_packages()) or 'none'}; its largest parts "
        f"(python3 scripts/bundle_size.py):\n{bundle.top()}"
    )


def test_the_budget_is_the_templates_until_you_add_packages(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    kit = '"pydantic>=2", "httpx>=0.27", "typing_extensions>=4.12"'
    pyproject.write_text(f"[project]\ndependencies = [{kit}]\n")
    assert bundle_size.added_packages(pyproject) == []
    assert bundle_size.default_limit(pyproject) == bundle_size.LIMIT_KIB == 2100
    pyproject.write_text(f'[project]\ndependencies = [{kit}, "PyYAML>=6", "pydantic[email]"]\n')
    assert bundle_size.added_packages(pyproject) == ["pyyaml"]
    assert bundle_size.default_limit(pyproject) == bundle_size.FREE_PLAN_KIB == 3072


def test_the_kit_is_deployed_bare_the_same_code_line_for_line(bundle: Any) -> None:
    sources = build_worker.worker_modules()
    kit = [name for name in sources if build_worker._within(name, build_worker.KIT)]
    assert len(kit) > 50
    for name in kit:
        source = sources[name].read_text()
        deployed = (bundle.outdir / build_worker._module_file(name, sources[name])).read_text()
        assert len(deployed.splitlines()) == len(source.splitlines()), name
        expected = ast.parse(source)
        for docstring in build_worker.docstrings(expected):
            docstring.value = ""
        assert ast.dump(ast.parse(deployed)) == ast.dump(expected), name
    # Yours as written: a tool's docstring is its description for the model.
    assert (bundle.outdir / "agent.py").read_text() == (PROJECT / "src" / "agent.py").read_text()


def test_bare_source_empties_docstrings_and_comment_lines_only() -> None:
    source = [
        '"""The module."""',
        "# a comment",
        "import re  # kept: code before it",
        "",
        "",
        "class A:",
        '    """A class.',
        "",
        "    On lines.",
        '    """',
        "",
        "    def f(self) -> None:",
        '        """Only a docstring: the function keeps a body."""',
        "",
        "",
        'TEXT = """',
        "# a line of the string, not a comment",
        '"""',
        "def g() -> int: '''doc'''; return 1  # code after the docstring: left as it is",
    ]
    bare = build_worker.bare_source("\n".join(source) + "\n")
    expected = [
        '""', "", "import re  # kept: code before it", "", "",
        "class A:", '    ""', "", "", "", "",
        "    def f(self) -> None:", '        ""', "", "",
        *source[15:],
    ]  # fmt: skip
    assert bare == "\n".join(expected) + "\n"
    namespace: dict[str, Any] = {}
    exec(compile(bare, "bare", "exec"), namespace)
    assert namespace["A"]().f() is None
    assert namespace["TEXT"] == "\n# a line of the string, not a comment\n"
    assert namespace["g"]() == 1


# -- every path the bundle keeps, on workerd ----------------------------------------------

# The tools a `use NAME...` message has the model call (each offered tool whose name ends
# with NAME: the MCP server's may come prefixed), with these arguments.
ARGUMENTS: dict[str, dict[str, Any]] = {
    "read_page": {"path": "/about"},
    "add_note": {"text": "kept from the bundle"},
    "list_notes": {},
    "remind": {"text": "water the plants"},
}
KEY = "sk-bundle-0123456789"


def play(body: Any) -> Reply:
    """The provider (Chat Completions, over real HTTP): `use NAME...` calls those tools in
    one step; once their results are in, and for any other message, it answers with what
    was asked and the results (JSON). As server-sent events when asked to stream."""
    messages = body["messages"]
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    ask = messages[start]["content"]
    results = [m["content"] for m in messages[start:] if m["role"] == "tool"]
    message: dict[str, Any] = {
        "role": "assistant", "content": json.dumps({"asked": ask, "results": results})
    }  # fmt: skip
    if ask.startswith("use ") and not results:
        offered = [tool["function"]["name"] for tool in body.get("tools") or []]
        calls = [
            {"id": f"call_{name}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(ARGUMENTS[wanted])}}
            for wanted in ask.split()[1:] for name in offered if name.endswith(wanted)
        ]  # fmt: skip
        message = {"role": "assistant", "content": "Using them.", "tool_calls": calls}
    finish = "tool_calls" if "tool_calls" in message else "stop"
    usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    if body.get("stream"):
        return Reply(events=_chunks(message, finish, usage))
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return Reply({"id": "chatcmpl-b", "object": "chat.completion", "created": 1,
                  "model": "fake", "choices": [choice], "usage": usage})  # fmt: skip


def _chunks(message: dict[str, Any], finish: str, usage: dict[str, int]) -> list[bytes]:
    """`message` as a stream sends it: the text in two pieces, each call whole, the
    finish reason, the usage last."""

    def chunk(delta: dict[str, Any] | None, reason: str | None = None) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": reason}]
        return {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1,
                "model": "fake", "choices": choices}  # fmt: skip

    text = message["content"]
    chunks = [chunk({"role": "assistant", "content": text[:5]}), chunk({"content": text[5:]})]
    chunks += [
        chunk({"tool_calls": [{"index": n, **call}]})
        for n, call in enumerate(message.get("tool_calls") or [])
    ]
    chunks += [chunk({}, finish), {**chunk(None), "usage": usage}]
    return [*(sse(c) for c in chunks), sse("[DONE]")]


def test_every_path_the_bundle_keeps_runs_from_it_alone_on_workerd() -> None:
    # One server (a workerd start is the suite's dearest step): the bundle built with
    # tests/agents/bundle_paths.py as the agent, served alone (runtime/agent_turn.py).
    with ScriptedServer([], answer=play) as provider:
        settings = {"LLM_PROVIDER": "openai", "LLM_BASE_URL": f"{provider.url}/v1",
                    "LLM_MODEL": "fake", "LLM_API_KEY": KEY, "RETENTION_DAYS": "30",
                    "CHAT_PAGE": "on"}  # fmt: skip
        with agent_turn.serve_agent(PATHS_AGENT, CONFIG, settings=settings) as (served, _):
            _run_every_path(served)
        log = served.output
    # Each model call (two per turn with tools, one per other turn) reached the provider
    # through the Worker's fetch, with its key, streamed: a Worker's turn always has
    # watchers (its live events), so the adapter reads server-sent events.
    assert len(provider.requests) == 6, log[-3000:]
    assert {r.path for r in provider.requests} == {"/v1/chat/completions"}
    assert {r.headers["authorization"] for r in provider.requests} == {f"Bearer {KEY}"}
    assert all(r.body.get("stream") is True for r in provider.requests)
    assert "retention: deleted 0 idle session(s)" in log, log[-3000:]


def _run_every_path(served: Any) -> None:
    # A turn: the OpenAI adapter, the Worker's HTTP client, the notes server's MCP tools
    # and a tool's schedule, all over fetch. (The note is listed by a later turn: the calls
    # of one step run side by side, so a list_notes beside add_note may run first.)
    turn = served.request(
        "POST", "/sessions/paths/messages", {"message": "use read_page add_note remind"}
    )
    assert turn.status == 200, f"{turn.raw!r}\n{served.output[-3000:]}"
    assert turn.json()["status"] == "complete", turn.json()
    page, kept, reminded = json.loads(turn.json()["response"])["results"]
    assert json.loads(page) == {
        "path": "/about", "status": 200, "body": {}, "idn_host": "xn--bcher-kva.example"
    }  # fmt: skip
    assert kept == "note 1 kept"
    assert reminded.startswith("scheduled sch_"), reminded
    # The tool's schedule: run by the session's Durable Object from its alarm.
    fired = _answered(served, "paths", "reminder: water the plants")
    assert fired["message"].get("origin") == "scheduled", fired
    # A schedule made over the API, fired the same way.
    made = served.request(
        "POST", "/sessions/paths/schedules", {"message": "from the API", "delay_seconds": 0}
    )
    assert made.status == 201, made.raw
    assert _answered(served, "paths", "from the API")["answer"]["asked"] == "from the API"
    # A turn asked for as server-sent events: the Worker's own sent on as they come.
    streamed = served.request(
        "POST", "/sessions/streamed/messages", {"message": "use list_notes"},
        headers={"accept": "text/event-stream"},
    )  # fmt: skip
    events = streamed.raw.decode()
    assert streamed.status == 200, events
    assert "event: delta" in events, events
    done = json.loads(events.split("event: done\ndata: ")[1].split("\n")[0])
    assert done["status"] == "complete", events
    assert json.loads(json.loads(done["response"])["results"][0]) == ["kept from the bundle"]
    # The retention cron (its line in the log: checked after), and the pages.
    assert served.request("GET", "/cdn-cgi/handler/scheduled?cron=17+*+*+*+*").status == 200
    view = served.request("GET", "/sessions/paths/view")
    assert view.status == 200, view.raw[:2000]
    assert b"water the plants" in view.raw
    assert served.request("GET", "/").status == 200


def _answered(served: Any, name: str, asked: str, within_s: float = 60) -> dict[str, Any]:
    """The stored user message `asked` of session `name` and the answer to its turn (JSON),
    once there: a turn the session's object runs by itself, from its alarm."""
    deadline = time.monotonic() + within_s
    while True:
        page = served.request("GET", f"/sessions/{name}?limit=1000")
        assert page.status == 200, page.raw
        messages = page.json()["messages"]
        at = next((i for i, m in enumerate(messages) if m["content"] == asked), None)
        answers = [] if at is None else [
            m for m in messages[at:] if m["role"] == "assistant" and not m.get("tool_calls")
        ]  # fmt: skip
        if answers:
            return {"message": messages[at], "answer": json.loads(answers[0]["content"])}
        assert time.monotonic() < deadline, f"no answer to {asked!r}:\n{served.output[-3000:]}"
        time.sleep(0.5)


def test_build_worker_follows_every_import_but_type_checking_and_cpython_only(
    tmp_path: Path,
) -> None:
    files = {
        "entry.py": "import agent\nfrom durable_agents.cloudflare import app\n",
        "agent.py": (
            "from typing import TYPE_CHECKING\n"
            "from helpers import util\n"
            "if TYPE_CHECKING:\n    import typed_only\n"
            "def make_deps(env, http):\n    import lazy\n"
        ),
        "helpers/__init__.py": "",
        "helpers/util.py": "from . import sibling\nfrom ..outside import nothing  # not in src\n",
        "helpers/sibling.py": "import json\n",
        "typed_only.py": "",
        "lazy.py": "",
        "unused.py": "",
        "durable_agents/__init__.py": "from .stores import base\n",
        "durable_agents/stores/__init__.py": (
            "from .base import Store\n"
            "def __getattr__(name):\n    from .sqlite import sqlite_store\n"
        ),
        "durable_agents/stores/base.py": "",
        "durable_agents/stores/migrations/0001_init.sql": "CREATE TABLE t (x);\n",
        "durable_agents/stores/sqlite.py": "",
        "durable_agents/cloudflare/page.html": "<p>hi</p>\n",
        "durable_agents/testing/page.css": "p {}\n",  # a package the Worker never imports
        "durable_agents/cloudflare/__init__.py": "",
        "durable_agents/cloudflare/app.py": "from ..testing import check_agent\n",
        "durable_agents/testing/__init__.py": "",
        "durable_agents.egg-info/top_level.txt": "durable_agents\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    staged = build_worker.stage(tmp_path / "out", tmp_path)
    assert set(staged) == {
        "entry", "agent", "helpers", "helpers.util", "helpers.sibling", "lazy",
        "durable_agents", "durable_agents.stores", "durable_agents.stores.base",
        "durable_agents.cloudflare", "durable_agents.cloudflare.app",
    }  # fmt: skip
    written = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.*")
    )
    modules = [str(path.relative_to(tmp_path)) for path in staged.values()]
    data = ["durable_agents/cloudflare/page.html", "durable_agents/stores/migrations/0001_init.sql"]
    assert written == sorted([*modules, *data])


def test_build_worker_stages_each_agent_module_as_a_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Worker imports src/agents/*.py by the folder's listing (served_agents), not by an
    # import statement: each is a root, with what it imports; the folder a package.
    monkeypatch.delenv(build_worker.AGENTS_OVERRIDE, raising=False)
    monkeypatch.delenv("DURABLE_AGENTS_AGENT", raising=False)
    files = {
        "entry.py": "import agent\n",
        "agent.py": "",
        "agents/refunds.py": "from helpers import money\n",
        "agents/research.py": "",
        "agents/Bad-Name.py": "",  # staged: the Worker refuses it at start, naming it
        "agents/notes/todo.py": "",  # not an agent module (a sub-folder)
        "helpers/__init__.py": "",
        "helpers/money.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    staged = build_worker.stage(tmp_path / "out", tmp_path)
    assert set(staged) == {
        "entry", "agent", "agents.refunds", "agents.research", "agents.Bad-Name", "helpers",
        "helpers.money",
    }  # fmt: skip
    out = tmp_path / "out"
    assert (out / "agents" / "__init__.py").read_text() == ""  # none in src/agents/: made
    assert (out / "agents" / "refunds.py").is_file()
    assert (out / "agents" / "Bad-Name.py").is_file()
    # The dev server's --agents DIR: that folder's modules instead of src/agents/'s.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "__init__.py").write_text("# mine\n")
    (other / "support.py").write_text("")
    monkeypatch.setenv(build_worker.AGENTS_OVERRIDE, str(other))
    staged = build_worker.stage(tmp_path / "out", tmp_path)
    assert {n for n in staged if n.startswith("agents")} == {"agents", "agents.support"}
    assert (out / "agents" / "__init__.py").read_text() == "# mine\n"
    assert not (out / "agents" / "refunds.py").exists()
