"""The run loop's contract, point by point (the crash sweep is in test_crash_sweep.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    MalformedToolCall,
    MemoryStoreNotDurableError,
    Message,
    MessageTooLargeError,
    RequestKeyReusedError,
    SessionConflictError,
    SessionNotFoundError,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    Usage,
    run,
    tool,
)
from durable_agents.stores import Store, memory_store
from durable_agents.testing import (
    ScriptedLLM,
    ScriptExhaustedError,
    SimulatedCrash,
    count_writes,
    crash_after_tool_results,
)


class Counter:
    """Side effects by call id, so tests assert counts, not only transcripts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def count(self, call_id: str) -> int:
        return sum(1 for _, cid in self.calls if cid == call_id)


class IssueRef(BaseModel):
    id: str


class Issue(BaseModel):
    title: str
    status: str


class SlackPost(BaseModel):
    channel: str
    text: str


def triage(effects: Counter, **agent_options: Any) -> Agent:
    @tool(safe_to_retry=True)
    async def get_issue(args: IssueRef, ctx: ToolContext) -> Issue:
        """Fetch an issue by id."""
        effects.calls.append(("get_issue", ctx.tool_call_id))
        return Issue(title=f"Issue {args.id}", status="open")

    @tool
    async def post_slack(args: SlackPost, ctx: ToolContext) -> dict[str, str]:
        """Post a message to a Slack channel."""
        effects.calls.append(("post_slack", ctx.tool_call_id))
        return {"ts": "1700000000.1"}

    return Agent("triage", "You triage issues.", [get_issue, post_slack], **agent_options)


def call(name: str, call_id: str = "", **arguments: Any) -> ToolCall:
    return ToolCall(call_id, name, arguments)


def steps(*responses: LLMResponse) -> ScriptedLLM:
    return ScriptedLLM(list(responses))


GET = call("get_issue", "c1", id="7")
POST = call("post_slack", "c2", channel="#ops", text="Issue 7 is open")


def two_step_script() -> ScriptedLLM:
    return steps(
        LLMResponse(tool_calls=[GET], usage=Usage(10, 2)),
        LLMResponse(text="Posting.", tool_calls=[POST], usage=Usage(20, 3)),
        LLMResponse(text="Done: posted.", usage=Usage(30, 4)),
    )


async def crash_after_step_one(
    store: Store, agent: Agent, llm: ScriptedLLM, message: str, **options: Any
) -> None:
    """Run session "s" until the process 'dies' on write #2 of its first step."""
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message=message, session_id="s",
                  store=crash_after_tool_results(store), **options)  # fmt: skip


def roles(messages: list[Message]) -> list[str]:
    return [m.role for m in messages]


# -- 1. activation ---------------------------------------------------------------


async def test_memory_store_with_session_id_raises_before_any_llm_call() -> None:
    llm = steps()
    with pytest.raises(MemoryStoreNotDurableError) as info:
        await run(triage(Counter()), llm=llm, message="hi", session_id="s1", store=memory_store())
    assert info.value.session_id == "s1"
    assert info.value.code == "memory-store-not-durable"
    assert llm.calls == []


async def test_without_store_runs_statelessly_and_returns_a_session_id() -> None:
    result = await run(triage(Counter()), llm=steps(LLMResponse(text="hello")), message="hi")
    assert result.status == "complete"
    assert result.response == "hello"
    assert result.session_id


async def test_durable_store_without_session_id_creates_one(durable_store: Store) -> None:
    ids = iter(["sess-1"])
    result = await run(
        triage(Counter()),
        llm=steps(LLMResponse(text="hello")),
        message="hi",
        store=durable_store,
        new_id=lambda: next(ids),
    )
    assert result.session_id == "sess-1"
    assert roles(await durable_store.load_messages("sess-1")) == ["user", "assistant"]


async def test_unseen_session_id_is_created_on_first_write(durable_store: Store) -> None:
    result = await run(
        triage(Counter()),
        llm=steps(LLMResponse(text="hi back")),
        message="hi",
        session_id="a" * 64,
        store=durable_store,
    )
    assert result.session_id == "a" * 64
    info = await durable_store.get_session("a" * 64)
    assert info is not None
    assert info.agent_name == "triage"


# -- 2. the writes of a turn ---------------------------------------------------------


async def test_each_step_is_two_writes_and_the_final_text_is_stored(durable_store: Store) -> None:
    effects = Counter()
    counting = count_writes(durable_store)
    result = await run(
        triage(effects), llm=two_step_script(), message="triage 7", session_id="s", store=counting
    )
    assert result.status == "complete"
    assert result.response == "Done: posted."
    assert counting.appends == 5  # 2 steps x (write #1 + write #2) + final text
    stored = await durable_store.load_messages("s")
    assert roles(stored) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert stored[-1] == Message.assistant("Done: posted.", usage=Usage(30, 4))
    assert stored[3].content == "Posting."  # text beside tool calls is kept
    assert result.messages == [Message.system("You triage issues."), *stored]
    assert result.steps == 3
    assert result.usage == Usage(60, 9)
    assert effects.calls == [("get_issue", "c1"), ("post_slack", "c2")]


async def test_write_one_lands_before_any_handler_runs(durable_store: Store) -> None:
    seen: list[list[str]] = []

    @tool
    async def post(args: dict[str, Any], ctx: ToolContext) -> str:
        """Post."""
        seen.append(roles(await durable_store.load_messages(ctx.session_id)))
        return "ok"

    agent = Agent("a", tools=[post])
    llm = steps(LLMResponse(tool_calls=[call("post", "p1")]), LLMResponse(text="done"))
    await run(agent, llm=llm, message="go", session_id="s", store=durable_store)
    assert seen == [["user", "assistant"]]


async def test_llm_sees_the_system_message_first_and_every_result() -> None:
    llm = two_step_script()
    await run(triage(Counter()), llm=llm, message="triage 7")
    first, _, third = llm.calls
    assert first.messages == [Message.system("You triage issues."), Message.user("triage 7")]
    assert [t.name for t in first.tools] == ["get_issue", "post_slack"]
    assert first.tools[0].input_schema["properties"]["id"]["type"] == "string"
    assert roles(third.messages) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert json.loads(third.messages[3].content) == {"title": "Issue 7", "status": "open"}


# -- 3. ids ------------------------------------------------------------------------------


async def test_calls_without_or_with_reused_ids_get_unique_ids(durable_store: Store) -> None:
    effects = Counter()
    ids = iter(f"g{i}" for i in range(100))
    llm = steps(
        LLMResponse(tool_calls=[call("get_issue", "", id="1"), call("get_issue", "", id="2")]),
        LLMResponse(tool_calls=[call("get_issue", "call_0", id="3")]),
        LLMResponse(tool_calls=[call("get_issue", "call_0", id="4")]),  # reused by the model
        LLMResponse(text="ok"),
    )
    await run(
        triage(effects),
        llm=llm,
        message="go",
        session_id="s",
        store=durable_store,
        new_id=lambda: next(ids),
    )
    stored = await durable_store.load_messages("s")
    call_ids = [c.id for m in stored for c in m.tool_calls]
    assert call_ids == ["call_g0", "call_g1", "call_0", "call_g2"]
    assert [m.tool_call_id for m in stored if m.role == "tool"] == call_ids


async def test_idempotency_key_is_stable_per_call_and_distinct_across_calls(
    durable_store: Store,
) -> None:
    keys: list[tuple[str, str, bool]] = []

    @tool(safe_to_retry=True)
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        """Look up."""
        keys.append((ctx.tool_call_id, ctx.idempotency_key, ctx.resumed))
        return "found"

    agent = Agent("a", tools=[lookup])
    llm = steps(
        LLMResponse(tool_calls=[call("lookup", "x1"), call("lookup", "x2")]),
        LLMResponse(text="done"),
    )
    await crash_after_step_one(durable_store, agent, llm, "go")
    await run(agent, llm=llm, session_id="s", store=durable_store)
    (c1, k1, r1), (c2, k2, r2), (c3, k3, r3), (c4, k4, r4) = keys
    assert (c1, c2, c3, c4) == ("x1", "x2", "x1", "x2")
    assert k1 == k3
    assert k2 == k4
    assert k1 != k2
    assert (r1, r2, r3, r4) == (False, False, True, True)
    assert len(k1) <= 64


# -- 4 and 5. resume ---------------------------------------------------------------


async def test_crash_after_handlers_gives_unsafe_tool_a_durability_error(
    durable_store: Store,
) -> None:
    effects = Counter()
    agent = triage(effects)
    llm = steps(
        LLMResponse(tool_calls=[POST]),
        # After resume the LLM must see the durability error and decide.
        lambda messages, tools: LLMResponse(text=f"saw: {messages[-1].content}"),
    )
    await crash_after_step_one(durable_store, agent, llm, "post it")
    assert effects.count("c2") == 1
    result = await run(agent, llm=llm, session_id="s", store=durable_store)
    assert effects.count("c2") == 1  # never re-run
    assert result.status == "complete"
    stored = await durable_store.load_messages("s")
    assert roles(stored) == ["user", "assistant", "tool", "assistant"]
    payload = json.loads(stored[2].content)
    assert set(payload) == {"error", "kind", "toolName", "toolCallId"}
    assert payload["kind"] == "tool-durability-error"
    assert (payload["toolName"], payload["toolCallId"]) == ("post_slack", "c2")
    assert "post_slack" in payload["error"]
    assert "c2" in payload["error"]
    assert "not re-invoked" in payload["error"]
    error = ToolDurabilityError.from_message(stored[2])
    assert error is not None
    assert (error.tool_name, error.tool_call_id, error.kind) == (
        "post_slack",
        "c2",
        "tool-durability-error",
    )
    assert result.response.startswith("saw: ")
    assert "tool-durability-error" in result.response
    assert ToolDurabilityError.from_message(stored[0]) is None


async def test_crash_after_handlers_reinvokes_a_safe_tool(durable_store: Store) -> None:
    effects = Counter()
    agent = triage(effects)
    llm = steps(LLMResponse(tool_calls=[GET]), LLMResponse(text="done"))
    await crash_after_step_one(durable_store, agent, llm, "look")
    result = await run(agent, llm=llm, session_id="s", store=durable_store)
    assert effects.count("c1") == 2
    stored = await durable_store.load_messages("s")
    assert json.loads(stored[2].content) == {"title": "Issue 7", "status": "open"}
    assert result.response == "done"


async def test_orphan_of_a_tool_no_longer_declared_gets_a_durability_error(
    durable_store: Store,
) -> None:
    @tool(safe_to_retry=True)
    async def old_tool(args: dict[str, Any]) -> str:
        """Gone after a deploy."""
        return "x"

    first = Agent("a", tools=[old_tool])
    llm = steps(LLMResponse(tool_calls=[call("old_tool", "o1")]))
    await crash_after_step_one(durable_store, first, llm, "go")
    second = Agent("a")
    result = await run(
        second, llm=steps(LLMResponse(text="ok")), session_id="s", store=durable_store
    )
    stored = await durable_store.load_messages("s")
    assert json.loads(stored[2].content)["kind"] == "tool-durability-error"
    assert result.status == "complete"


async def test_orphans_are_repaired_in_one_write_before_the_llm_call(durable_store: Store) -> None:
    effects = Counter()
    agent = triage(effects)
    calls = [call("get_issue", "a", id="1"), call("post_slack", "b", channel="#x", text="t")]
    await durable_store.append_messages_atomic(
        "s", 0, [Message.user("go"), Message.assistant("", calls)]
    )
    counting = count_writes(durable_store)
    llm = steps(LLMResponse(text="done"))
    await run(agent, llm=llm, session_id="s", store=counting)
    assert counting.appends == 2  # the repair, then the final text
    assert roles(llm.calls[0].messages) == ["system", "user", "assistant", "tool", "tool"]
    assert effects.calls == [("get_issue", "a")]


async def test_message_none_finishes_an_interrupted_turn_without_a_user_message(
    durable_store: Store,
) -> None:
    agent = triage(Counter())
    llm = steps(
        LLMResponse(tool_calls=[GET]),
        RuntimeError("provider down"),
        LLMResponse(text="finished"),
    )
    failed = await run(agent, llm=llm, message="go", session_id="s", store=durable_store)
    assert failed.status == "error"
    resumed = await run(agent, llm=llm, session_id="s", store=durable_store)
    assert resumed.response == "finished"
    stored = await durable_store.load_messages("s")
    assert roles(stored) == ["user", "assistant", "tool", "assistant"]


async def test_message_none_on_a_finished_turn_returns_the_reply_without_the_llm(
    durable_store: Store,
) -> None:
    agent = triage(Counter())
    await run(agent, llm=two_step_script(), message="go", session_id="s", store=durable_store)
    llm = steps()
    again = await run(agent, llm=llm, session_id="s", store=durable_store)
    assert (again.status, again.response, again.steps) == ("complete", "Done: posted.", 0)
    assert llm.calls == []


async def test_message_none_on_an_empty_session_is_a_clear_error(durable_store: Store) -> None:
    with pytest.raises(SessionNotFoundError, match="no history") as info:
        await run(triage(Counter()), llm=steps(), session_id="never", store=durable_store)
    assert isinstance(info.value, ValueError)
    assert info.value.session_id == "never"
    with pytest.raises(ValueError, match="needs a message"):
        await run(triage(Counter()), llm=steps())


async def test_a_second_turn_continues_the_history(durable_store: Store) -> None:
    agent = triage(Counter())
    await run(
        agent, llm=steps(LLMResponse(text="one")), message="1", session_id="s", store=durable_store
    )
    llm = steps(LLMResponse(text="two"))
    await run(agent, llm=llm, message="2", session_id="s", store=durable_store)
    assert [m.content for m in llm.calls[0].messages[1:]] == ["1", "one", "2"]


# -- 6. concurrency --------------------------------------------------------------------


async def test_a_writer_that_lost_the_race_gets_a_conflict_and_dispatches_nothing(
    durable_store: Store,
) -> None:
    effects = Counter()
    agent = triage(effects)
    await run(
        agent, llm=steps(LLMResponse(text="hi")), message="0", session_id="s", store=durable_store
    )
    both_loaded = asyncio.Barrier(2)

    async def post_once_both_loaded(messages: list[Message], tools: object) -> LLMResponse:
        await both_loaded.wait()  # both runs have read the same history
        return LLMResponse(tool_calls=[call("post_slack", "", channel="#x", text="t")])

    outcomes = await asyncio.gather(
        *(
            run(
                agent,
                llm=ScriptedLLM([post_once_both_loaded, LLMResponse(text=f"{text} done")]),
                message=text,
                session_id="s",
                store=durable_store,
            )
            for text in ("a", "b")
        ),
        return_exceptions=True,
    )
    conflicts = [o for o in outcomes if isinstance(o, SessionConflictError)]
    assert len(conflicts) == 1, outcomes
    assert conflicts[0].session_id == "s"
    assert len(effects.calls) == 1  # only the winner dispatched
    stored = await durable_store.load_messages("s")
    assert [m.content for m in stored if m.role == "user"] in (["0", "a"], ["0", "b"])


# -- 7. tool failures are results --------------------------------------------------------


async def run_one_call(agent: Agent, tool_call: ToolCall) -> dict[str, Any]:
    llm = steps(LLMResponse(tool_calls=[tool_call]), LLMResponse(text="ok"))
    result = await run(agent, llm=llm, message="go")
    assert result.status == "complete"
    content = result.messages[3].content
    parsed: dict[str, Any] = json.loads(content)
    return parsed


async def test_unknown_tool_is_a_result() -> None:
    out = await run_one_call(triage(Counter()), call("delete_everything", "u1"))
    assert out["kind"] == "unknown-tool"
    assert "get_issue" in out["error"]


async def test_invalid_arguments_are_a_result_and_the_handler_is_not_called() -> None:
    effects = Counter()
    out = await run_one_call(triage(effects), call("post_slack", "p1", channel=5))
    assert out["kind"] == "invalid-arguments"
    assert "channel" in out["error"]
    assert "text" in out["error"]
    assert effects.calls == []


async def test_json_schema_dict_input_is_checked_and_arrives_as_dict() -> None:
    received: list[Any] = []

    async def handler(args: Any, ctx: ToolContext) -> str:
        received.append(args)
        return "ok"

    schema = {"properties": {"n": {"type": "integer"}}, "required": ["n"]}
    agent = Agent(
        "a", tools=[tool(name="count", description="Count.", input=schema, handler=handler)]
    )
    bad = await run_one_call(agent, call("count", "c1", n="three"))
    assert bad["kind"] == "invalid-arguments"
    assert "arguments.n" in bad["error"]
    llm = steps(LLMResponse(tool_calls=[call("count", "c2", n=3)]), LLMResponse(text="ok"))
    await run(agent, llm=llm, message="go")
    assert received == [{"n": 3}]


async def test_handler_raising_is_a_result() -> None:
    @tool
    async def flaky(args: dict[str, Any]) -> str:
        """Fails."""
        raise ValueError("upstream said no")

    out = await run_one_call(Agent("a", tools=[flaky]), call("flaky", "f1"))
    assert out == {
        "error": "Tool 'flaky' failed: ValueError: upstream said no",
        "kind": "tool-failed",
    }


@pytest.mark.parametrize(
    "error",
    [ConnectionError("reset by peer"), httpx.ReadTimeout("read"), httpx.RemoteProtocolError("eof")],
    ids=["ConnectionError", "httpx.ReadTimeout", "httpx.RemoteProtocolError"],
)
async def test_an_unsafe_tool_lost_in_transport_is_an_unknown_outcome(error: Exception) -> None:
    # The request may have landed: a model told "failed" would make a new call
    # (with a new idempotency key) and post twice. It is told what a crash tells.
    @tool
    async def post(args: dict[str, Any]) -> str:
        """Posts."""
        raise error

    out = await run_one_call(Agent("a", tools=[post]), call("post", "p1"))
    assert out["kind"] == "tool-durability-error"
    assert (out["toolName"], out["toolCallId"]) == ("post", "p1")
    assert "may or may not have taken effect" in out["error"]
    assert "Do not repeat it blindly" in out["error"]
    assert type(error).__name__ in out["error"]


async def test_a_safe_tool_lost_in_transport_is_a_plain_failure() -> None:
    @tool(safe_to_retry=True)
    async def read(args: dict[str, Any]) -> str:
        """Reads."""
        raise httpx.ConnectError("refused")

    out = await run_one_call(Agent("a", tools=[read]), call("read", "r1"))
    assert out["kind"] == "tool-failed"


async def test_output_failing_validation_is_a_result() -> None:
    @tool
    async def bad_output(args: dict[str, Any]) -> Issue:
        """Returns the wrong shape."""
        return {"title": "x"}  # type: ignore[return-value]

    out = await run_one_call(Agent("a", tools=[bad_output]), call("bad_output", "b1"))
    assert out["kind"] == "invalid-output"
    assert "status" in out["error"]


async def test_oversized_result_is_a_result_not_a_failed_write(durable_store: Store) -> None:
    @tool
    async def dump(args: dict[str, Any]) -> str:
        """Returns a lot."""
        return "x" * 5_000

    agent = Agent("a", tools=[dump], max_result_bytes=4_096)
    llm = steps(LLMResponse(tool_calls=[call("dump", "d1")]), LLMResponse(text="ok"))
    result = await run(agent, llm=llm, message="go", session_id="s", store=durable_store)
    out = json.loads(result.messages[3].content)
    assert out["kind"] == "result-too-large"
    assert "5,000 bytes" in out["error"]


async def test_a_safe_tool_timing_out_is_a_timeout_result() -> None:
    @tool(timeout=0.01, safe_to_retry=True)
    async def slow(args: dict[str, Any]) -> str:
        """Never finishes."""
        await asyncio.sleep(10)
        return "late"

    out = await run_one_call(Agent("a", tools=[slow]), call("slow", "s1"))
    assert out["kind"] == "tool-timeout"
    assert "safe to retry" in out["error"]


async def test_an_unsafe_tool_timing_out_is_an_unknown_outcome() -> None:
    @tool(timeout=0.01)
    async def post(args: dict[str, Any]) -> str:
        """Hangs after sending."""
        await asyncio.sleep(10)
        return "late"

    out = await run_one_call(Agent("a", tools=[post]), call("post", "s1"))
    assert out["kind"] == "tool-durability-error"
    assert "did not finish within 0.01 s" in out["error"]
    assert ToolDurabilityError.from_message(
        Message.tool_result(call("post", "s1"), json.dumps(out))
    )


async def test_a_handler_raising_timeouterror_itself_is_a_failure_not_a_timeout() -> None:
    @tool(timeout=5, safe_to_retry=True)
    async def own_timeout(args: dict[str, Any]) -> str:
        """Raises its own TimeoutError."""
        raise TimeoutError("socket")

    out = await run_one_call(Agent("a", tools=[own_timeout]), call("own_timeout", "t1"))
    assert out["kind"] == "tool-failed"


async def test_parallel_calls_run_concurrently_and_results_keep_call_order() -> None:
    order: list[str] = []

    @tool
    async def wait(args: dict[str, Any], ctx: ToolContext) -> str:
        """Waits."""
        await asyncio.sleep(args["s"])
        order.append(ctx.tool_call_id)
        return ctx.tool_call_id

    calls = [call("wait", "slow", s=0.05), call("wait", "fast", s=0)]
    llm = steps(LLMResponse(tool_calls=calls), LLMResponse(text="ok"))
    result = await run(Agent("a", tools=[wait]), llm=llm, message="go")
    assert order == ["fast", "slow"]
    assert [m.content for m in result.messages[3:5]] == ["slow", "fast"]


async def test_a_crash_inside_one_handler_propagates_and_stores_no_result(
    durable_store: Store,
) -> None:
    @tool
    async def dies(args: dict[str, Any]) -> str:
        """Simulates the process dying mid-handler."""
        raise SimulatedCrash("mid-handler")

    @tool
    async def fine(args: dict[str, Any]) -> str:
        """Fine."""
        await asyncio.sleep(0.01)
        return "ok"

    agent = Agent("a", tools=[dies, fine])
    llm = steps(LLMResponse(tool_calls=[call("fine", "f"), call("dies", "d")]))
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="go", session_id="s", store=durable_store)
    assert roles(await durable_store.load_messages("s")) == ["user", "assistant"]


async def test_sync_handlers_are_accepted() -> None:
    @tool
    def add(args: dict[str, Any]) -> int:
        """Adds."""
        return int(args["a"]) + int(args["b"])

    out = await run(
        Agent("a", tools=[add]),
        llm=steps(LLMResponse(tool_calls=[call("add", "x", a=1, b=2)]), LLMResponse(text="3")),
        message="go",
    )
    assert out.messages[3].content == "3"


# -- 8. LLM failures and max_steps ------------------------------------------------------


async def test_first_llm_call_failing_keeps_the_message_for_resume(durable_store: Store) -> None:
    writes = count_writes(durable_store)
    result = await run(
        triage(Counter()),
        llm=steps(RuntimeError("rate limited")),
        message="go",
        session_id="s",
        store=writes,
        request_key="k1",
    )
    assert result.status == "error"
    assert result.error == "RuntimeError: rate limited"
    assert writes.appends == 1  # the message alone, on this error path only
    assert await durable_store.load_messages("s") == [Message("user", "go", request_key="k1")]
    # message=None finishes that turn with that message; the LLM sees it once.
    llm = steps(LLMResponse(text="done"))
    resumed = await run(triage(Counter()), llm=llm, session_id="s", store=durable_store)
    assert (resumed.status, resumed.response) == ("complete", "done")
    assert [m.content for m in llm.calls[0].messages if m.role == "user"] == ["go"]
    # So does a retry of the request (same key): it returns that turn's reply.
    again = await run(
        triage(Counter()), llm=steps(), message="go", session_id="s", store=durable_store,
        request_key="k1",
    )  # fmt: skip
    assert again.response == "done"


async def test_a_later_llm_call_failing_writes_nothing_more(durable_store: Store) -> None:
    effects: Counter = Counter()
    writes = count_writes(durable_store)
    llm = steps(LLMResponse(tool_calls=[call("get_issue", "g1", id="7")]), RuntimeError("down"))
    result = await run(triage(effects), llm=llm, message="go", session_id="s", store=writes)
    assert result.status == "error"
    assert writes.appends == 2  # write #1 and write #2 of the step, nothing else


async def test_llm_returning_the_wrong_type_is_an_error_status() -> None:
    bad = ScriptedLLM([lambda m, t: "not a response"])  # type: ignore[arg-type,return-value]
    result = await run(triage(Counter()), llm=bad, message="go")
    assert result.status == "error"
    assert "LLMResponse" in (result.error or "")


async def test_max_steps_stops_the_loop_and_the_session_stays_resumable(
    durable_store: Store,
) -> None:
    effects = Counter()
    agent = triage(effects, max_steps=2)
    looping = ScriptedLLM(
        [lambda m, t: LLMResponse(tool_calls=[call("get_issue", "", id="1")])] * 2
    )
    result = await run(agent, llm=looping, message="go", session_id="s", store=durable_store)
    assert (result.status, result.steps) == ("max_steps", 2)
    finish = await run(
        agent, llm=steps(LLMResponse(text="ok")), session_id="s", store=durable_store
    )
    assert finish.status == "complete"


async def test_script_exhaustion_is_loud() -> None:
    with pytest.raises(ScriptExhaustedError, match="1 steps"):
        await run(
            triage(Counter()),
            llm=steps(LLMResponse(tool_calls=[GET])),
            message="go",
        )


# -- configuration errors ------------------------------------------------------------------


async def test_handler_for_an_undeclared_tool_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="does not declare"):
        await run(triage(Counter()), llm=steps(), message="go", tools={"post_slak": print})


async def test_declared_tool_without_handler_is_a_configuration_error() -> None:
    decl = tool(name="post", description="Post.", input=SlackPost)
    with pytest.raises(ConfigurationError, match="no handler"):
        await run(Agent("a", tools=[decl]), llm=steps(), message="go")


async def test_handlers_supplied_per_run_override_by_name() -> None:
    decl = tool(name="post", description="Post.", input=SlackPost)
    seen: list[SlackPost] = []

    async def handler(args: SlackPost, ctx: ToolContext) -> str:
        seen.append(args)
        return "ok"

    llm = steps(
        LLMResponse(tool_calls=[call("post", "p", channel="#a", text="t")]), LLMResponse(text="k")
    )
    await run(Agent("a", tools=[decl]), llm=llm, message="go", tools={"post": handler})
    assert seen == [SlackPost(channel="#a", text="t")]


async def test_non_string_message_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="string"):
        await run(triage(Counter()), llm=steps(), message=42)  # type: ignore[arg-type]


async def test_oversized_user_message_is_refused_before_anything(durable_store: Store) -> None:
    llm = steps()
    with pytest.raises(MessageTooLargeError, match="max_message_bytes") as info:
        await run(
            triage(Counter(), max_message_bytes=100),
            llm=llm,
            message="x" * 101,
            session_id="s",
            store=durable_store,
        )
    assert (info.value.size, info.value.limit, info.value.role) == (101, 100, "user")
    assert llm.calls == []
    assert await durable_store.load_messages("s") == []


def test_agent_limits_cannot_exceed_the_stores_row_limit() -> None:
    with pytest.raises(ConfigurationError, match="max_result_bytes"):
        Agent("a", max_result_bytes=3_000_000)
    with pytest.raises(ConfigurationError, match="max_message_bytes"):
        Agent("a", max_message_bytes=0)


async def test_deps_reach_handlers() -> None:
    got: list[Any] = []

    @tool
    async def use(args: dict[str, Any], ctx: ToolContext) -> str:
        """Uses deps."""
        got.append(ctx.deps)
        return "ok"

    llm = steps(LLMResponse(tool_calls=[call("use", "u")]), LLMResponse(text="k"))
    await run(Agent("a", tools=[use]), llm=llm, message="go", deps={"api": "x"})
    assert got == [{"api": "x"}]


async def test_a_malformed_call_orphaned_by_a_crash_is_never_run_with_empty_arguments(
    durable_store: Store,
) -> None:
    ran: list[Any] = []

    @tool(safe_to_retry=True)
    async def ping(args: dict[str, Any]) -> str:
        """Safe, and takes no required argument: `{}` would pass its schema."""
        ran.append(args)
        return "pong"

    broken = MalformedToolCall(
        "m1", "ping", {}, raw_arguments="{not json", arguments_error="The arguments were not JSON."
    )
    agent = Agent("a", tools=[ping])
    llm = steps(LLMResponse(tool_calls=[broken]), LLMResponse(text="ok"))
    await crash_after_step_one(durable_store, agent, llm, "go")
    stored_call = (await durable_store.load_messages("s"))[1].tool_calls[0]
    assert isinstance(stored_call, MalformedToolCall)
    assert stored_call.raw_arguments == "{not json"
    result = await run(agent, llm=llm, session_id="s", store=durable_store)
    assert ran == []
    assert json.loads(result.messages[3].content) == {
        "error": "The arguments were not JSON.",
        "kind": "invalid-arguments",
    }


def test_message_json_codec_round_trips() -> None:
    call = ToolCall("c1", "post", {"text": "é"})
    broken = MalformedToolCall(
        "c2", "post", {}, raw_arguments="[1]", arguments_error="not an object"
    )
    messages = [
        Message.system("sys"),
        Message.user("hi"),
        Message.assistant("", [call, broken], Usage(3, 4)),
        Message.tool_result(call, "ok"),
    ]
    assert [Message.from_dict(json.loads(json.dumps(m.to_dict()))) for m in messages] == messages


# -- request keys: a retried request does not start another turn ------------------------


async def test_a_repeated_request_key_returns_the_stored_reply(durable_store: Store) -> None:
    effects = Counter()
    agent = triage(effects)
    first = await run(agent, llm=two_step_script(), message="go", session_id="s",
                      store=durable_store, request_key="req-1")  # fmt: skip
    llm = steps()
    again = await run(agent, llm=llm, message="go", session_id="s", store=durable_store,
                      request_key="req-1")  # fmt: skip
    assert (again.status, again.response, again.steps) == ("complete", first.response, 0)
    assert llm.calls == []
    assert len(effects.calls) == 2
    stored = await durable_store.load_messages("s")
    assert [m.request_key for m in stored if m.role == "user"] == ["req-1"]


async def test_a_repeated_request_key_finishes_its_interrupted_turn(durable_store: Store) -> None:
    effects = Counter()
    agent = triage(effects)
    llm = steps(LLMResponse(tool_calls=[POST]), LLMResponse(text="checked: maybe posted"))
    await crash_after_step_one(durable_store, agent, llm, "post", request_key="k")
    retried = await run(agent, llm=llm, message="post", session_id="s", request_key="k",
                        store=durable_store)  # fmt: skip
    assert retried.response == "checked: maybe posted"
    assert effects.count("c2") == 1
    stored = await durable_store.load_messages("s")
    assert roles(stored) == ["user", "assistant", "tool", "assistant"]
    assert ToolDurabilityError.from_message(stored[2]) is not None


async def test_a_request_key_of_an_earlier_turn_returns_that_turns_reply(
    durable_store: Store,
) -> None:
    agent = triage(Counter())
    for key, reply in (("a", "first reply"), ("b", "second reply")):
        await run(agent, llm=steps(LLMResponse(text=reply)), message=f"msg {key}",
                  session_id="s", store=durable_store, request_key=key)  # fmt: skip
    late = await run(agent, llm=steps(), message="msg a", session_id="s",
                     store=durable_store, request_key="a")  # fmt: skip
    assert (late.response, late.steps) == ("first reply", 0)
    assert len(await durable_store.load_messages("s")) == 4


async def test_a_request_key_reused_for_another_message_is_refused(durable_store: Store) -> None:
    agent = triage(Counter())
    await run(agent, llm=steps(LLMResponse(text="ok")), message="one", session_id="s",
              store=durable_store, request_key="k")  # fmt: skip
    with pytest.raises(RequestKeyReusedError, match="another message"):
        await run(agent, llm=steps(), message="two", session_id="s", store=durable_store,
                  request_key="k")  # fmt: skip
    with pytest.raises(ConfigurationError, match="pass it with message"):
        await run(agent, llm=steps(), session_id="s", store=durable_store, request_key="k")


async def test_a_request_whose_first_llm_call_failed_can_be_retried_with_its_key(
    durable_store: Store,
) -> None:
    agent = triage(Counter())
    failed = await run(agent, llm=steps(RuntimeError("down")), message="hi", session_id="s",
                       store=durable_store, request_key="k")  # fmt: skip
    assert failed.status == "error"
    ok = await run(agent, llm=steps(LLMResponse(text="hello")), message="hi", session_id="s",
                   store=durable_store, request_key="k")  # fmt: skip
    assert ok.response == "hello"
