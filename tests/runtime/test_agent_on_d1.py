"""A durable agent run inside workerd on its D1: crash after a side effect, then resume."""

from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, ToolCall, ToolDurabilityError, run, tool
from durable_agents.cloudflare import d1_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_after_tool_results

posted = []


class Post(BaseModel):
    text: str


@tool
async def post(args: Post) -> str:
    """Publish a post (a side effect: must run at most once)."""
    posted.append(args.text)
    return "posted"


AGENT = Agent(name="poster", instructions="Post what you are asked to.", tools=[post])


async def test_crash_after_the_side_effect_never_repeats_it(env):
    posted.clear()
    store = d1_store(env.DB)
    await store.create_tables()
    call = ToolCall("call-1", "post", {"text": "hello from Pyodide"})
    llm = ScriptedLLM([LLMResponse(tool_calls=[call]), LLMResponse(text="Done.")])

    crashed = False
    try:
        await run(AGENT, llm=llm, message="post hi", session_id="s1",
                  store=crash_after_tool_results(store))  # fmt: skip
    except SimulatedCrash:
        crashed = True
    assert crashed
    assert posted == ["hello from Pyodide"]

    result = await run(AGENT, llm=llm, session_id="s1", store=store)
    assert result.status == "complete"
    assert result.response == "Done."
    assert posted == ["hello from Pyodide"]  # not re-invoked

    history = await store.load_messages("s1")
    repaired = ToolDurabilityError.from_message(history[2])
    assert repaired is not None
    assert repaired.tool_call_id == "call-1"
    assert history[-1].content == "Done."
    info = await store.get_session("s1")
    assert info is not None
    assert (info.agent_name, info.state, info.message_count) == ("poster", "idle", len(history))
