"""The agent module is enough (issue 22): `scripts/dev --agent FILE` serving a module these
tests write to a temporary folder, with wrangler.toml as it is. One server for the module.

- Settings: names the module declares in SETTINGS, absent from [vars], reach the Worker's
  env from .dev.vars or from the environment (which wins); one that [vars] leaves empty
  takes its .dev.vars value; quotes, `$`, `#`, spaces and non-ASCII characters arrive
  as written. WORKERS_PLAN from the environment reaches the Worker as well as the limits.
- The banner: the session store (SESSION_STORE) and each setting with its source;
  values only from [vars], defaults, and the kit's settings that are not secrets.
- Reload: an edit of the agent file, which is outside src/, reloads the Worker within
  seconds (the time is printed), and the sessions stored before it are still there; a
  broken edit leaves the running Worker alone. An edit importing a module python_modules/
  lacks (yaml: .venv has it) is warned of with the command that adds it; the Worker
  answers every request with the import's error (printed once) and the server stays up;
  the file fixed, the Worker serves turns again.
- Fail fast: LLM_PROVIDER=anthropic without LLM_API_KEY stops scripts/dev before
  wrangler starts, naming the setting and where to set it; so does a setting an agent's
  toolset reads (tests/agents/mcp_only.py: MCPTools(url_setting="MCP_URL")) left empty.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import PROJECT, DevServer

pytestmark = pytest.mark.slow

TOKEN = "test-token"
PROBE_AGENT = '''
"""Answers each message with the settings it names, as the Worker's env holds them."""

import json

from durable_agents import Agent, LLMResponse
from durable_agents.llm.offline import FunctionLLM

VERSION = "first"
AGENT = Agent("probe", "Report the settings the message names.")
SETTINGS = ("PROBE_DEV_VARS", "PROBE_ENV", "PROBE_BOTH", "PROBE_UNSET", "ISSUES_API_URL")


def make_deps(env, http):
    return None


def make_llm(env):
    def answer(messages, tools):
        names = [m for m in messages if m.role == "user"][-1].content.split()
        values = {name: getattr(env, name, None) for name in names}
        return LLMResponse(json.dumps({"version": VERSION, "env": values}))

    return FunctionLLM(answer)
'''
TRICKY = 'a "quoted" $HOME ${PATH} # not a comment, \u00fc\u00df \u2713  '
DEV_VARS = (
    f"PROBE_DEV_VARS='{TRICKY}'\n"
    "PROBE_BOTH=from-dev-vars\n"
    "ISSUES_API_URL=https://issues.example/api\n"
    "SESSION_STORE=durable-object\n"
    f"SESSION_TOKEN_SECRET={'s' * 40}\n"
)
ENVIRONMENT = {
    "API_TOKEN": TOKEN,
    "PROBE_ENV": "env $value with #hash",
    "PROBE_BOTH": "from-environment",
    "MAX_SESSION_TOKENS": "500000",
    "WORKERS_PLAN": "paid",
}
ASKED = "PROBE_DEV_VARS PROBE_ENV PROBE_BOTH PROBE_UNSET ISSUES_API_URL WORKERS_PLAN"


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    file = tmp_path_factory.mktemp("elsewhere") / "probe_agent.py"
    file.write_text(PROBE_AGENT)
    return file


@pytest.fixture(scope="module")
def server(agent_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    dev = DevServer(tmp_path_factory.mktemp("settings"), ENVIRONMENT, DEV_VARS, agent=agent_file)
    dev.start()
    try:
        yield dev
    finally:
        dev.kill_all()


def ask(server: DevServer, session: str, text: str = ASKED, timeout: float = 60) -> Any:
    status, _, reply = server.request(
        "POST", f"/sessions/{session}/messages", json.dumps({"message": text}).encode(),
        timeout=timeout,
    )  # fmt: skip
    assert status == 200, reply
    return json.loads(reply["response"])


def test_settings_of_the_agent_module_reach_the_worker_from_dev_vars_and_the_environment(
    server: DevServer,
) -> None:
    assert ask(server, "settings") == {
        "version": "first",
        "env": {
            "PROBE_DEV_VARS": TRICKY,
            "PROBE_ENV": "env $value with #hash",
            "PROBE_BOTH": "from-environment",
            "PROBE_UNSET": None,
            "ISSUES_API_URL": "https://issues.example/api",
            "WORKERS_PLAN": "paid",
        },
    }
    assert "PROBE" not in (Path(__file__).parents[2] / "wrangler.toml").read_text()


def test_the_banner_names_the_session_store_and_each_settings_source(server: DevServer) -> None:
    out = "\n".join(server.lines)
    banner = out[: out.index("dev: ready on")]
    for line in [
        "dev: agent probe; model: demo (the agent's make_llm decides); session store: "
        "durable-object (SESSION_STORE from .dev.vars)",
        "dev: API_TOKEN is set (environment)",
        "dev: LLM_PROVIDER=demo ([vars])",
        "dev: CHAT_PAGE=on (the default)",
        "dev: MAX_SESSION_TOKENS=500000 (environment)",
        "dev: SESSION_TOKEN_SECRET is set (.dev.vars)",
        "dev: PROBE_DEV_VARS is set (.dev.vars)",
        "dev: PROBE_ENV is set (environment)",
        "dev: PROBE_BOTH is set (environment)",
        "dev: PROBE_UNSET is not set",
        "dev: ISSUES_API_URL is set (.dev.vars)",
        "dev: WORKERS_PLAN=paid (environment): per invocation at most 10,000 subrequests",
    ]:
        assert line in banner, line
    for secret in (TOKEN, "s" * 40, "from-environment", "from-dev-vars", "$value", "quoted"):
        assert secret not in out, secret
    assert "SLACK_WEBHOOK_URL" not in out  # only the served agent's settings are named
    # No DEV_STUBS in this agent: /__dev/ is an ordinary unknown path.
    assert server.request("GET", "/__dev/PROBE_ENV/x")[0] == 404


def test_an_edit_of_the_agent_file_reloads_the_worker_and_keeps_the_sessions(
    server: DevServer, agent_file: Path
) -> None:
    before = ask(server, "before-reload", "PROBE_UNSET")
    assert before["version"] == "first"
    # A broken edit: the running Worker stays as it is, and the server says why.
    agent_file.write_text(PROBE_AGENT.replace("def make_deps(env, http):", "def make_deps("))
    server.wait_for_line(r"^dev: the Worker is not reloaded: .*probe_agent\.py", timeout=10)
    assert ask(server, "while-broken", "PROBE_UNSET")["version"] == "first"

    process = server.process
    agent_file.write_text(PROBE_AGENT.replace('VERSION = "first"', 'VERSION = "second"'))
    edited = time.monotonic()
    version, polls = "first", 0
    while version == "first" and time.monotonic() - edited < 60:
        polls += 1
        with contextlib.suppress(OSError, AssertionError):  # the old Worker went mid-request
            version = ask(server, f"reload-poll-{polls}", "PROBE_UNSET", timeout=30)["version"]
        time.sleep(0.1)
    took = time.monotonic() - edited
    print(f"reload: the edit was served after {took:.2f} s ({polls} requests)")
    assert version == "second"
    # A reload, not a restart of scripts/dev: the same server process served the edit, and
    # it announced no second start. (~3 s on an idle 2-core machine, up to ~7 s on a busy
    # one, the new workerd starting Python and importing the Worker; the time is printed,
    # not asserted: a loaded machine slows both a reload and a restart.)
    assert server.process is process
    assert process is not None
    assert process.poll() is None
    assert sum(line.startswith("dev: ready on") for line in server.lines) == 1, server.lines
    server.wait_for_line(r"probe_agent\.py changed: the Worker reloads")

    status, _, history = server.request("GET", "/sessions/before-reload")
    assert status == 200, history
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
    assert ask(server, "before-reload", "PROBE_UNSET")["version"] == "second"
    status, _, history = server.request("GET", "/sessions/before-reload")
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"] * 2


def test_an_agent_importing_a_module_the_worker_lacks_is_named_and_the_server_stays_up(
    server: DevServer, agent_file: Path
) -> None:
    # yaml: in .venv (mkdocs, a docs extra, brings it), never in python_modules/ (it has no
    # wheel the Worker can load: scripts/add-package refuses it).
    assert importlib.util.find_spec("yaml") is not None
    assert not (PROJECT / "python_modules" / "yaml").exists()
    process = server.process
    # CPython (.venv) imports it; workerd (python_modules/) cannot.
    agent_file.write_text(PROBE_AGENT + "import yaml\n")
    line = PROBE_AGENT.count("\n") + 1
    server.wait_for_line(
        rf"^dev: warning: .*probe_agent\.py, line {line}, imports `yaml`, which the Worker's "
        r"packages \(python_modules/\) lack: add it with `scripts/add-package pyyaml`",
        timeout=30,
    )
    said = (
        f"probe_agent.py does not load: line {line} (`import yaml`): ModuleNotFoundError: No "
        "module named 'yaml': add the package that provides it: `scripts/add-package pyyaml`"
    )
    edited, answer = time.monotonic(), None
    while time.monotonic() - edited < 60:
        with contextlib.suppress(OSError):  # the old Worker went mid-request
            status, _, answer = server.request(
                "POST", "/sessions/not-loaded/messages", b'{"message": "PROBE_UNSET"}'
            )
            if status == 500:
                break
        time.sleep(0.2)
    assert answer is not None
    assert answer["error"]["code"] == "agent-not-loaded", answer
    assert said in answer["error"]["message"]
    assert server.request("GET", "/sessions/not-loaded")[2]["error"]["code"] == "agent-not-loaded"
    # The server runs on; the Worker printed the error once, not per request.
    assert process is not None
    assert process.poll() is None
    assert server.process is process
    server.wait_for_line(re.escape(said))
    answered = 2 + sum(  # each answered with the error, none printing it again
        server.request("GET", f"/sessions/not-loaded-{n}")[0] == 500 for n in range(4)
    )
    assert answered == 6
    # Printed once per load of the Worker (a save can reach workerd as two reloads), not per
    # request.
    printed = sum(said in line and "Until it loads" in line for line in server.lines)
    assert 1 <= printed < answered, server.lines

    # Fixed (the import gone): the Worker reloads and serves turns again.
    agent_file.write_text(PROBE_AGENT.replace('VERSION = "first"', 'VERSION = "fixed"'))
    version, polls = None, 0
    while version != "fixed" and time.monotonic() - edited < 120:
        polls += 1
        with contextlib.suppress(OSError, AssertionError):
            version = ask(server, f"fixed-{polls}", "PROBE_UNSET", timeout=30)["version"]
        time.sleep(0.2)
    assert version == "fixed"
    assert process.poll() is None


def test_a_model_that_needs_a_key_without_one_stops_the_start(tmp_path: Path) -> None:
    agent = tmp_path / "plain_agent.py"
    agent.write_text(
        "from durable_agents import Agent\n"
        "AGENT = Agent('plain', 'Be brief.')\n"
        "def make_deps(env, http):\n"
        "    return None\n"
    )
    server = DevServer(tmp_path / "state", {"LLM_PROVIDER": "anthropic"}, agent=agent)
    with pytest.raises(RuntimeError, match=r"exited \(1\) before it was ready") as raised:
        server.start()
    why = str(raised.value)
    assert "dev: LLM_PROVIDER=anthropic needs LLM_API_KEY (an Anthropic API key)" in why
    assert "(LLM_PROVIDER=anthropic is from environment): set LLM_API_KEY in " in why
    assert "dev-worker.dev.vars or the environment" in why
    assert "`scripts/wrangler secret put LLM_API_KEY`" in why


def test_a_setting_a_toolset_reads_without_a_value_stops_the_start(tmp_path: Path) -> None:
    agent = PROJECT / "tests" / "agents" / "mcp_only.py"  # MCPTools(url_setting="MCP_URL")
    server = DevServer(tmp_path / "state", {}, "MCP_URL=\n", agent=agent)  # empty: not set
    with pytest.raises(RuntimeError, match=r"exited \(1\) before it was ready") as raised:
        server.start()
    why = str(raised.value)
    assert (
        "dev: the agent's toolset MCPTools(url_setting='MCP_URL', name=None) needs MCP_URL, "
        "which is not set: every turn would fail. Set MCP_URL in "
    ) in why
    assert "dev-worker.dev.vars, the environment or [vars] of wrangler.toml. " in why
    assert "`scripts/wrangler secret put MCP_URL`" in why
    assert "Ready on" not in why  # wrangler never started
