"""A durable agent run inside Pyodide, with the OpenAI-compatible adapter reaching a local
server on 127.0.0.1 through the runtime's fetch (the default client under Pyodide)."""

import sys

from pydantic import BaseModel

from durable_agents import Agent, run, tool
from durable_agents.cloudflare import FetchTransport, d1_store
from durable_agents.llm import OpenAILLM, RetryPolicy


class City(BaseModel):
    city: str


@tool(safe_to_retry=True)
async def get_weather(args: City) -> dict:
    """Current weather for a city."""
    return {"city": args.city, "sky": "sunny"}


async def test_openai_adapter_run_over_fetch_on_d1(env, openai_server):
    assert sys.platform == "emscripten"
    store = d1_store(env.DB)
    await store.create_tables()
    llm = OpenAILLM(
        "test-model", "sk-test", base_url=openai_server["url"], retry=RetryPolicy.none()
    )
    assert isinstance(llm._http.client._transport, FetchTransport)
    agent = Agent("weather", "Answer with the weather tool.", [get_weather])
    result = await run(agent, llm=llm, message="Weather in Paris?", session_id="w1", store=store)
    await llm.aclose()
    assert result.status == "complete", result.error
    assert result.response == 'The weather: {"city":"Paris","sky":"sunny"}'
    assert result.usage.input_tokens == 22
    stored = await store.load_messages("w1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].tool_calls[0].id == "call_w1"
