"""Check any agent module against the at-most-once contract, at every crash point.

    from durable_agents.testing import check_agent

    def test_agent() -> None:
        report = check_agent(importlib.import_module("agent"))   # the module of src/agent.py
        print(report)   # agent 'refunds': 148 crash points, 752 runs, 528 requests; ...
                        # then a table: how far each tool got (report.tools)

What it runs, what it asserts and whose rule a failure names (the agent's or the
kit's): docs/testing.md, "`check_agent`: any agent at every crash point"; the
per-tool counts and the failure of a side effect that never completed: "The
report: how far each tool got"; `values=` (TestLLM's values per format):
"Steering `TestLLM`'s values"; the module's own options: "`CHECK_AGENT`"; an agent
with agent tools (`agents=`): "Agents that call agents: `agents=`".

The rooms of this package, for a reader changing one rule:

    _driver               check_agent, check_agent_async: set up, then sweep every crash point
    _config               the agent module (its CHECK_AGENT), settings and env (CheckEnv), servers
    _player               one scenario played (turns, crashes, resumes), then checked
    _listing              the toolsets' tools, listed once before the check
    _scenario             a scenario and what was recorded in it; the crash points' labels
    _recording            the handlers, toolsets and store, wrapped to record
    _transport            the `http` client: requests recorded, answered or forwarded
    _decisions            how waiting calls are decided (decide=) and approved; the edits
    _rules                a stored call's rules: safe_to_retry, requires_approval
    _check_history        the shape of a stored history
    _check_calls          at most once, durability errors, idempotency keys
    _check_approvals      approved, denied and edited calls
    _check_server_calls   MCP calls that reached a toolset's server
    _children             the agents its agent tools call (agents=), as the check runs them
    _check_children       each call's child turn: once, its side effects at most once, answered
    _breach               a failure, saying whose rule broke; a side effect never completed
    _report               RecordedRequest, AgentCheckReport, ToolCounts and the counts behind it
"""

from __future__ import annotations

# Importable from here as before, beside __all__: the env a run's make_deps gets, the
# history as failures print it, and the types of check_agent's arguments.
from ._check_history import format_history as format_history
from ._config import CheckEnv as CheckEnv
from ._decisions import Decide as Decide
from ._decisions import DecidePolicy as DecidePolicy
from ._decisions import Decision as Decision
from ._driver import check_agent, check_agent_async
from ._report import AgentCheckReport, RecordedRequest, ToolCounts
from ._transport import Responder as Responder

__all__ = [
    "AgentCheckReport",
    "RecordedRequest",
    "ToolCounts",
    "check_agent",
    "check_agent_async",
]
