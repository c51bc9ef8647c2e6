"""Several agents per Worker, on CPython: `served_agents` finds and checks `src/agent.py` and
`src/agents/*.py`; `/agents/{agent}/sessions/...` serves every session route of that agent
(its object `<agent>:<name>`, the command naming it), `/sessions/...` stays the default
agent's; an unknown agent is a 404 naming the served ones; the listing filters by agent;
a session token opens one agent's session only. Over HTTP on scripts/dev:
test_dev_server_several_agents.py."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from tests.support.app_calls import Recorder

from durable_agents import Agent, Message
from durable_agents.cloudflare.agent_module import DEV_SERVER_NOTE, AgentModule
from durable_agents.cloudflare.app import Command, Reply, handle_request
from durable_agents.cloudflare.served_agents import (
    AGENT_KEY,
    ObjectAgent,
    ServedAgents,
    merged_dev_stubs,
    module_names,
    object_name,
    serve_agents,
)
from durable_agents.cloudflare.tokens import verify_session_token
from durable_agents.errors import ConfigurationError
from durable_agents.stores.memory import MemoryStore

TOKEN = "master-token"
SECRET = "0123456789abcdef0123456789abcdef-secret"
ENV = {"API_TOKEN": TOKEN, "SESSION_TOKEN_SECRET": SECRET}
NOW = 1_800_000_000.0


def _module(name: str, **fields: Any) -> AgentModule:
    return AgentModule(Agent(name), lambda env, http: None, **fields)


SERVED = ServedAgents(
    _module("support"),
    {"refunds": _module("refunds-desk"), "research": _module("researcher")},
)


async def call(
    method: str, path: str, body: Any = None, *, bearer: str = TOKEN,
    recorder: Recorder | None = None, served: ServedAgents | None = SERVED,
    store: MemoryStore | None = None,
) -> Reply:  # fmt: skip
    raw = b"" if body is None else json.dumps(body).encode()
    path, _, query = path.partition("?")
    return await handle_request(
        method, path, {"authorization": f"Bearer {bearer}"}, raw, env=ENV, query=query,
        dispatch=recorder or Recorder(), clock=lambda: NOW, served=served,
        sessions=(lambda: store) if store is not None else None,
    )  # fmt: skip


SESSION_ROUTES = [
    ("GET", "/sessions/s1", None, "history"),
    ("DELETE", "/sessions/s1", None, "delete"),
    ("POST", "/sessions/s1/messages", {"message": "hi"}, "message"),
    ("POST", "/sessions/s1/resume", None, "resume"),
    ("GET", "/sessions/s1/approvals", None, "approvals"),
    ("POST", "/sessions/s1/approvals/call-1", {"approved": False, "digest": "0" * 64}, "approve"),
    ("GET", "/sessions/s1/events", None, "events"),
    ("POST", "/sessions/s1/cancel", None, "cancel"),
    ("GET", "/sessions/s1/view", None, "view"),
    ("GET", "/sessions/s1/schedules", None, "schedules"),
    ("POST", "/sessions/s1/schedules", {"message": "later", "delay_seconds": 60}, "schedule"),
    ("DELETE", "/sessions/s1/schedules/sched-1", None, "unschedule"),
]


@pytest.mark.parametrize(("method", "path", "body", "action"), SESSION_ROUTES)
async def test_every_session_route_is_served_under_the_agents_prefix(
    method: str, path: str, body: Any, action: str
) -> None:
    recorder = Recorder()
    reply = await call(method, f"/agents/refunds{path}", body, recorder=recorder)
    assert reply.status == 200, reply.body
    ((name, command),) = recorder.commands
    assert (name, command.action, command.name, command.agent) == (
        "refunds:s1", action, "s1", "refunds",
    )  # fmt: skip
    assert json.loads(command.to_json())["agent"] == "refunds"
    assert Command.from_json(command.to_json()) == command
    # The default agent's: its object the session's name, its command as before (no agent).
    recorder = Recorder()
    assert (await call(method, path, body, recorder=recorder)).status == 200
    ((name, command),) = recorder.commands
    assert (name, command.agent) == ("s1", None)
    assert "agent" not in json.loads(command.to_json())


@pytest.mark.parametrize("path", ["/agents/nobody/sessions/s1", "/agents/Refunds/sessions/s1",
                                  "/agents//sessions/s1", "/agents/nobody/sessions"])  # fmt: skip
async def test_an_unknown_agent_is_a_404_naming_the_served_ones(path: str) -> None:
    recorder = Recorder()
    reply = await call("GET", path, recorder=recorder)
    assert (reply.status, reply.body["error"]["code"]) == (404, "unknown-agent"), reply.body
    message = reply.body["error"]["message"]
    assert "/agents/refunds/sessions, /agents/research/sessions" in message
    assert "/sessions (the default agent)" in message
    assert recorder.commands == []
    reply = await call("GET", "/agents/refunds", recorder=recorder)
    assert (reply.status, reply.body["error"]["code"]) == (404, "not-found")
    assert "/agents/refunds/sessions/{name}" in reply.body["error"]["message"]


async def test_without_a_default_agent_sessions_is_unknown_and_the_listing_stays() -> None:
    served = ServedAgents(None, {"refunds": _module("refunds-desk")})
    reply = await call("POST", "/sessions/s1/messages", {"message": "hi"}, served=served)
    assert (reply.status, reply.body["error"]["code"]) == (404, "unknown-agent")
    assert "no default agent" in reply.body["error"]["message"]
    assert (await call("GET", "/sessions", served=served, store=MemoryStore())).status == 200


async def test_an_agent_that_did_not_load_answers_its_error_the_others_are_served() -> None:
    served = ServedAgents(_module("support"), {"research": _module("researcher")},
                          {"refunds": "src/agents/refunds.py does not load: line 3"})  # fmt: skip
    reply = await call("POST", "/agents/refunds/sessions/s1/messages", {"message": "hi"},
                       served=served)  # fmt: skip
    assert (reply.status, reply.body["error"]["code"]) == (500, "agent-not-loaded")
    assert reply.body["error"]["message"] == "src/agents/refunds.py does not load: line 3"
    recorder = Recorder()
    for path in ("/agents/research/sessions/s1", "/sessions/s1"):
        assert (await call("GET", path, served=served, recorder=recorder)).status == 200
    assert [name for name, _ in recorder.commands] == ["research:s1", "s1"]
    assert served.names == ("refunds", "research")
    assert served.none_loaded is None


async def test_the_listing_filters_by_agent() -> None:
    store = MemoryStore()
    for session_id, agent in [("a", "support"), ("b", "refunds-desk"), ("c", "support")]:
        await store.append_messages_atomic(session_id, 0, [Message.user("hi")], agent_name=agent)

    async def ids(path: str) -> list[str]:
        reply = await call("GET", path, store=store)
        assert reply.status == 200, reply.body
        return sorted(s["session_id"] for s in reply.body["sessions"])

    assert await ids("/sessions") == ["a", "b", "c"]
    assert await ids("/agents/refunds/sessions") == ["b"]  # served name -> AGENT.name
    assert await ids("/agents/refunds/sessions/") == ["b"]
    assert await ids("/sessions?agent=refunds") == ["b"]
    assert await ids("/agents/research/sessions?limit=5") == []
    reply = await call("GET", "/sessions?agent=nobody", store=store)
    assert (reply.status, reply.body["error"]["code"]) == (404, "unknown-agent")


async def test_a_session_token_opens_its_agents_session_only() -> None:
    minted = await call("POST", "/agents/refunds/sessions/s1/token")
    assert minted.status == 200, minted.body
    assert (minted.body["session"], minted.body["agent"]) == ("s1", "refunds")
    token = minted.body["token"]
    assert verify_session_token(SECRET, token, now=NOW) == "refunds:s1"
    recorder = Recorder()
    own = await call("GET", "/agents/refunds/sessions/s1", bearer=token, recorder=recorder)
    assert own.status == 200, own.body
    for path in ("/sessions/s1", "/agents/research/sessions/s1", "/agents/refunds/sessions/s2"):
        reply = await call("GET", path, bearer=token, recorder=recorder)
        assert (reply.status, reply.body["error"]["code"]) == (403, "forbidden"), path
    assert [name for name, _ in recorder.commands] == ["refunds:s1"]
    # The default agent's token, as before: its session only, not another agent's "s1".
    default = await call("POST", "/sessions/s1/token")
    assert set(default.body) == {"token", "expires_at", "session"}
    assert verify_session_token(SECRET, default.body["token"], now=NOW) == "s1"
    reply = await call("GET", "/agents/refunds/sessions/s1", bearer=default.body["token"])
    assert reply.status == 403
    assert (await call("GET", "/sessions/s1", bearer=default.body["token"])).status == 200


def test_a_command_names_a_served_agent_or_none() -> None:
    assert Command("cancel", agent="refunds").agent == "refunds"
    for bad in ("Refunds", "1x", "a" * 33, "re-funds"):
        with pytest.raises(ValueError, match="not a command"):
            Command.from_json(json.dumps({"action": "cancel", "agent": bad}))
    assert object_name(None, "s1") == "s1"
    assert object_name("refunds", "s1") == "refunds:s1"


class _Storage:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.puts = 0

    async def get(self, key: str) -> Any:
        return self.values.get(key)

    async def put(self, key: str, value: Any) -> None:
        self.puts += 1
        self.values[key] = value


async def test_a_session_object_remembers_its_agent_for_its_alarm() -> None:
    storage = _Storage()
    first = ObjectAgent(lambda: storage)
    assert await first.of("refunds") == "refunds"
    assert await first.of("refunds") == "refunds"
    assert (storage.values, storage.puts) == ({AGENT_KEY: "refunds"}, 1)  # once per instance
    later = ObjectAgent(lambda: storage)  # after a reset: the alarm, the retention's delete
    assert await later.remembered() == "refunds"
    assert await later.of(None) == "refunds"
    default = ObjectAgent(lambda: _Storage())
    assert await default.of(None) is None


# -- finding and checking the modules ------------------------------------------------------

TAIL = "def make_deps(env, http):\n    return None\n"


def _agent_file(path: Path, name: str, extra: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"from durable_agents import Agent\nAGENT = Agent({name!r})\n{extra}{TAIL}")


def _loader(folder: Path) -> Any:
    def load(path: Path, as_name: str) -> Any:
        spec = importlib.util.spec_from_file_location(as_name, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def named(name: str) -> Any:
        return load(folder / "agents" / f"{name}.py", f"agents_under_test_{name}")

    return lambda: load(folder / "agent.py", "agent_under_test"), named


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, DEV_SERVER_NOTE, raising=False)


@pytest.fixture
def dev_server(monkeypatch: pytest.MonkeyPatch) -> None:
    note = types.ModuleType(DEV_SERVER_NOTE)
    monkeypatch.setitem(sys.modules, DEV_SERVER_NOTE, note)


@pytest.mark.usefixtures("deployed")
def test_the_default_and_each_module_of_agents_are_served(tmp_path: Path) -> None:
    _agent_file(tmp_path / "agent.py", "support")
    _agent_file(tmp_path / "agents" / "refunds.py", "refunds-desk")
    _agent_file(tmp_path / "agents" / "research.py", "researcher")
    (tmp_path / "agents" / "__init__.py").write_text("")
    (tmp_path / "agents" / "notes.txt").write_text("not a module")
    served = serve_agents(str(tmp_path / "entry.py"), *_loader(tmp_path))
    assert served.default is not None
    assert served.default.agent.name == "support"
    assert served.names == ("refunds", "research")
    assert served.agent_name("refunds") == "refunds-desk"
    assert served.failures == {}
    # src/agents/ alone: no default agent.
    (tmp_path / "agent.py").unlink()
    served = serve_agents(str(tmp_path / "entry.py"), *_loader(tmp_path))
    assert (served.default, served.names) == (None, ("refunds", "research"))


@pytest.mark.usefixtures("deployed")
def test_deployed_a_bad_name_a_clash_a_broken_module_or_nothing_stops_the_worker(
    tmp_path: Path,
) -> None:
    entry = str(tmp_path / "entry.py")
    with pytest.raises(ConfigurationError, match="no agent to serve"):
        serve_agents(entry, *_loader(tmp_path))
    _agent_file(tmp_path / "agents" / "Refund-Desk.py", "x")
    with pytest.raises(ConfigurationError, match=r"Refund-Desk\.py: 'Refund-Desk' is not an agent"):
        serve_agents(entry, *_loader(tmp_path))
    with pytest.raises(ConfigurationError, match="rename the file"):
        module_names(str(tmp_path / "agents"))
    (tmp_path / "agents" / "Refund-Desk.py").unlink()
    _agent_file(tmp_path / "agent.py", "support")
    _agent_file(tmp_path / "agents" / "refunds.py", "support")
    with pytest.raises(ConfigurationError, match=(
        r"^src/agent.py and src/agents/refunds.py define one agent name, 'support'"
    )):  # fmt: skip
        serve_agents(entry, *_loader(tmp_path))
    (tmp_path / "agents" / "refunds.py").write_text("AGENT = 1\n")
    with pytest.raises(ConfigurationError, match=r"^src/agents/refunds.py must define AGENT"):
        serve_agents(entry, *_loader(tmp_path))


@pytest.mark.usefixtures("dev_server")
def test_under_the_dev_server_one_broken_module_leaves_the_others_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _agent_file(tmp_path / "agent.py", "support")
    _agent_file(tmp_path / "agents" / "research.py", "researcher")
    (tmp_path / "agents" / "refunds.py").write_text("import no_such_module_here\n")
    _agent_file(tmp_path / "agents" / "twin.py", "researcher")
    _agent_file(tmp_path / "agents" / "Bad-Name.py", "bad")
    served = serve_agents(str(tmp_path / "entry.py"), *_loader(tmp_path))
    assert served.default is not None
    assert set(served.named) == set()  # research and twin clash: neither is served
    assert served.names == ("refunds", "research", "twin")
    assert served.failures["refunds"].startswith(
        "src/agents/refunds.py does not load: line 1 (`import no_such_module_here`)"
    )
    assert "define one agent name, 'researcher'" in served.failures["twin"]
    out = capsys.readouterr().out
    assert "Until it loads, its routes answer every request with this error" in out
    assert "src/agents/Bad-Name.py: 'Bad-Name' is not an agent's name" in out


def test_dev_stubs_of_several_modules_are_one_mapping_and_may_not_differ() -> None:
    def stub(*args: Any) -> tuple[int, Any]:
        return 200, {}

    def other(*args: Any) -> tuple[int, Any]:
        return 200, {}

    modules = {
        "src/agent.py": _module("a", dev_stubs={"PAYMENTS_URL": stub}, settings=("PAYMENTS_URL",)),
        "src/agents/b.py": _module(
            "b",
            dev_stubs={"PAYMENTS_URL": stub, "CRM_URL": other},
            settings=("CRM_URL", "PAYMENTS_URL"),
        ),
    }
    assert dict(merged_dev_stubs(modules)) == {"PAYMENTS_URL": stub, "CRM_URL": other}
    served = ServedAgents(modules["src/agent.py"], {"b": modules["src/agents/b.py"]})
    assert served.settings == ("PAYMENTS_URL", "CRM_URL")
    modules["src/agents/c.py"] = _module("c", dev_stubs={"CRM_URL": stub})
    with pytest.raises(ConfigurationError, match=(
        r"^src/agents/c.py and src/agents/b.py both have a dev stub for CRM_URL, and not the same"
    )):  # fmt: skip
        merged_dev_stubs(modules)
