"""Test doubles for agents built on durable-agents: a scripted LLM, crash points, and
`check_agent` (any agent at every crash point).

    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "post", {...})]),
                       LLMResponse(text="done")])
    crashing = crash_on_write(store, before="result of post")   # dies on step 1's write #2
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="hi", session_id="s1", store=crashing)
    result = await run(agent, llm=llm, session_id="s1", store=store)  # resume

The guide: docs/testing.md. The modules: `scripted_llm` (ScriptedLLM and what it was
sent), `crash_points` (SimulatedCrash, CrashingStore and the helpers that make one),
`check_agent`, `conformance` (the store contract as checks), `worker` and
`pytest_plugin` (the Worker over HTTP, in-runtime tests). `TestLLM` and `FunctionLLM`
are the offline models of `durable_agents.llm.offline`, re-exported here.
"""

from __future__ import annotations

from ..llm.offline import FunctionLLM, TestLLM
from .check_agent import AgentCheckReport, check_agent, check_agent_async
from .crash_points import (
    CrashingStore,
    SimulatedCrash,
    count_writes,
    crash_after_tool_results,
    crash_on_write,
)
from .scripted_llm import LLMCall, ScriptedLLM, ScriptExhaustedError

__all__ = [
    "AgentCheckReport",
    "CrashingStore",
    "FunctionLLM",
    "LLMCall",
    "ScriptExhaustedError",
    "ScriptedLLM",
    "SimulatedCrash",
    "TestLLM",
    "check_agent",
    "check_agent_async",
    "count_writes",
    "crash_after_tool_results",
    "crash_on_write",
]
