"""`durable_agents.testing.check_agent`: passes on sound agents, fails on broken ones.

The mutation tests break one thing each (the agent, the store, the kit
itself) and assert the check notices, so a check that passes means something.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import re
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field

from durable_agents import Agent, ConfigurationError, Message, ToolCall, ToolContext, tool
from durable_agents.llm.offline import arguments_for
from durable_agents.stores import Store, sqlite_store
from durable_agents.testing import check_agent, check_agent_async
from durable_agents.testing.check_agent import CheckEnv


class Query(BaseModel):
    q: str


class Post(BaseModel):
    text: str = Field(min_length=1)


def agent_module(*tools: Any, make_deps: Any = None, **extra: Any) -> ModuleType:
    """An agent module made in a test: AGENT over `tools`, make_deps giving `http`."""
    module = ModuleType("test_agent_module")
    module.AGENT = Agent("probe", "Use the tools.", list(tools))  # type: ignore[attr-defined]
    module.make_deps = make_deps or (  # type: ignore[attr-defined]
        lambda env, http: SimpleNamespace(env=env, http=http)
    )
    for name, value in extra.items():
        setattr(module, name, value)
    return module


@tool(safe_to_retry=True)
async def lookup(args: Query, ctx: ToolContext) -> dict[str, Any]:
    """A read."""
    response = await ctx.deps.http.get(f"https://api.example/items/{args.q}")
    return {"status": response.status_code}


@tool
async def post(args: Post, ctx: ToolContext) -> dict[str, Any]:
    """A side effect, keyed."""
    response = await ctx.deps.http.post(
        "https://api.example/posts",
        json={"text": args.text},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return {"status": response.status_code}


@tool
def count(args: Query) -> int:
    """A sync handler without ctx and without requests."""
    return len(args.q)


@pytest.mark.parametrize("name", ["examples.triage.agent", "examples.refunds.agent"])
def test_passes_on_the_examples(name: str) -> None:
    report = check_agent(importlib.import_module(name))
    if name == "examples.triage.agent":
        # Two tools, two turns: 3 appends a turn all at once, 5 one tool a step; x2 sides.
        assert report.crash_points == (3 * 2 + 5 * 2) * 2
        assert (report.approval_tools, report.approved, report.denied) == ((), 0, 0)
    else:
        # issue_refund needs approval: swept approving (all at once: write #1, the lookup's
        # result, the decision, the claim, the refund's result, the reply = 6 a turn; one
        # tool a step: 7), denying (no claim, a tool-denied result: 5 and 6) and approving
        # with edited arguments (as approving: the edit is in the decision's write); two
        # turns, x2 sides.
        assert report.crash_points == ((6 + 7) * 2 + (5 + 6) * 2 + (6 + 7) * 2) * 2
        assert report.approval_tools == ("issue_refund",)
        assert report.approved > report.edited > 0
        assert report.denied > 0
        assert "none ran unapproved" in str(report)
        assert "with edited arguments" in str(report)
    assert report.runs > report.crash_points
    assert report.requests > report.crash_points
    assert report.durability_errors > 0
    assert report.safe_reinvocations > 0
    assert report.unkeyed_unsafe_requests == ()
    assert "no unsafe request sent twice" in str(report)


def test_passes_on_a_small_agent_and_counts_what_it_did() -> None:
    report = check_agent(agent_module(lookup, post, count), config=None)
    assert report.agent == "probe"
    assert (report.safe_tools, report.unsafe_tools) == (("lookup",), ("count", "post"))
    # 3 tools: 3 appends a turn all at once, 7 one tool a step; two turns; x2 sides.
    assert report.crash_points == (3 * 2 + 7 * 2) * 2
    assert report.durability_errors > 0
    assert report.safe_reinvocations > 0


async def test_async_form_and_no_nested_event_loop() -> None:
    module = agent_module(lookup, post)
    with pytest.raises(RuntimeError, match="check_agent_async"):
        check_agent(module, config=None)
    report = await check_agent_async(module, config=None, turns=1)
    assert report.crash_points == (3 + 5) * 2


def test_concurrent_handlers_have_their_requests_attributed_to_their_own_call() -> None:
    def keyed_tool(name: str) -> Any:
        async def handler(args: Query, ctx: ToolContext) -> str:
            for part in range(3):  # interleave with the other handler of the step
                await asyncio.sleep(0)
                await ctx.deps.http.post(
                    f"https://api.example/{name}/{part}",
                    headers={"Idempotency-Key": ctx.idempotency_key},
                )
            return "ok"

        return tool(name=name, description="Post.", input=Query, handler=handler)

    report = check_agent(agent_module(keyed_tool("a"), keyed_tool("b")), config=None)
    # Each request carries the key of the call the check attributed it to.
    assert report.unkeyed_unsafe_requests == ()
    assert report.requests > 0


# -- the env and the http client --------------------------------------------------------


def test_env_is_the_configs_vars_as_attributes(tmp_path: Path) -> None:
    config = tmp_path / "wrangler.toml"
    config.write_text(
        '[vars]\nREGION = "eu"\nLIMIT = 3\nPAYMENTS_API_URL = ""\nOTHER_URL = "https://x.test"\n'
    )
    seen: list[Any] = []

    def make_deps(env: Any, http: httpx.AsyncClient) -> Any:
        seen.append(env)
        return SimpleNamespace(http=http)

    check_agent(agent_module(count, make_deps=make_deps), config=config, env={"EXTRA": "1"})
    env = seen[0]
    assert (env.REGION, env.LIMIT, env.EXTRA, env.OTHER_URL) == ("eu", 3, "1", "https://x.test")
    assert env.PAYMENTS_API_URL == "https://payments-api-url.check.invalid"  # empty *_URL
    with pytest.raises(AttributeError, match="API_TOKEN"):
        _ = env.API_TOKEN  # like a binding or setting a Worker does not have


def test_the_default_config_is_found_above_the_agent_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    def make_deps(env: Any, http: httpx.AsyncClient) -> Any:
        seen.append(env)
        return SimpleNamespace(http=http)

    module = agent_module(count, make_deps=make_deps)
    module.__file__ = str(Path(__file__).resolve().parents[1] / "src" / "agent.py")
    monkeypatch.chdir(tmp_path)  # no wrangler.toml here: the project's, above src/, is used
    check_agent(module, turns=1)
    assert seen[0].MAX_BODY_BYTES == "65536"


def test_a_missing_config_or_setting_is_said_plainly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config"):
        check_agent(agent_module(count), config=tmp_path / "nope.toml")

    def needs_a_key(env: Any, http: httpx.AsyncClient) -> Any:
        return env.API_KEY

    with pytest.raises(AssertionError, match=r"make_deps\(env, http\) raised AttributeError"):
        check_agent(agent_module(count, make_deps=needs_a_key), config=None)
    assert CheckEnv({"A": "1"}).A == "1"


def test_requests_are_answered_by_respond_or_the_agents_dev_stub() -> None:
    answers: list[str] = []

    @tool
    async def fetch(args: Query, ctx: ToolContext) -> str:
        """Read what the API says."""
        response = await ctx.deps.http.post(
            f"{ctx.deps.env.SHOP_URL}/x", headers={"Idempotency-Key": ctx.idempotency_key}
        )
        answers.append(response.json()["from"])
        return "ok"

    def stub(method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        return 200, {"from": f"stub {method} {path}"}

    module = agent_module(fetch, DEV_STUBS={"SHOP_URL": stub})
    check_agent(module, config=None, turns=1)
    assert set(answers) == {"stub POST /x"}

    answers.clear()
    check_agent(
        module,
        config=None,
        turns=1,
        respond=lambda request: httpx.Response(200, json={"from": "respond"}),
    )
    assert set(answers) == {"respond"}


class Sku(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-\d+$")


class Coupon(BaseModel):
    model_config = ConfigDict(regex_engine="python-re")  # lookarounds need Python's re
    code: str = Field(pattern=r"^(?=.*\d)[A-Z0-9]{8}$")  # a digit somewhere: a lookahead
    note: str = ""


def test_patterned_arguments_are_made_to_match_and_the_rest_is_said_by_name() -> None:
    @tool
    async def order(args: Sku, ctx: ToolContext) -> str:
        """Order a SKU."""
        return args.sku

    report = check_agent(agent_module(order), config=None, turns=1)
    assert report.unsafe_tools == ("order",)  # "AAA-1" reached the handler

    @tool
    async def redeem(args: Coupon, ctx: ToolContext) -> str:
        """Redeem a coupon."""
        return args.code

    module = agent_module(redeem)
    with pytest.raises(ConfigurationError) as failure:
        check_agent(module, config=None)
    text = str(failure.value)
    assert "tool 'redeem'" in text
    assert "$.code: its pattern '^(?=.*\\d)[A-Z0-9]{8}$': a lookahead '(?='" in text
    assert 'arguments={"redeem": {"code": ..., "note": ""}}' in text
    report = check_agent(module, config=None, turns=1, arguments={"redeem": {"code": "ABCD1234"}})
    assert report.unsafe_tools == ("redeem",)

    with pytest.raises(AssertionError) as wrong:  # arguments given by hand that do not fit
        check_agent(module, config=None, turns=1, arguments={"redeem": {"code": "nope"}})
    assert "your agent broke a rule: TestLLM's call of tool 'redeem' never reached" in str(
        wrong.value
    )
    assert "the arguments= given for it do not fit its input schema" in str(wrong.value)
    with pytest.raises(ConfigurationError, match="nope"):
        check_agent(module, config=None, arguments={"nope": {}})


# -- mutations: each breaks one thing, and the check must fail ------------------------


def test_fails_on_a_tool_marked_safe_that_posts_without_its_key() -> None:
    @tool(safe_to_retry=True)
    async def charge(args: Query, ctx: ToolContext) -> str:
        """Charges a card, but claims to be safe to retry."""
        await ctx.deps.http.post("https://pay.example/charges", json={"q": args.q})
        return "charged"

    with pytest.raises(AssertionError) as failure:
        check_agent(agent_module(lookup, charge), config=None)
    text = str(failure.value)
    assert "re-sent POST https://pay.example/charges without its idempotency key" in text
    assert "your agent broke a rule: tool 'charge' is declared safe_to_retry" in text
    assert "the kit broke a rule" not in text
    assert "stored history:" in text
    assert "a crash before append #" in text  # the crash point, named
    assert "write #2" in text


class AcksWriteOneEarly:
    """A broken store: it acknowledges write #1 (the calls) before it is durable. It lands
    with the next append; a crash in between (the next thing the store sees is a load, as
    in a new process) loses it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.pending: tuple[str, int, list[Message], dict[str, Any]] | None = None

    @property
    def durable(self) -> bool:
        return True

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: Sequence[Message], **kwargs: Any
    ) -> int:
        if self.pending is not None:
            sid, seq, pending, pending_kwargs = self.pending
            self.pending = None
            await self.inner.append_messages_atomic(sid, seq, pending, **pending_kwargs)
        if messages[-1].role == "assistant" and messages[-1].tool_calls:
            self.pending = (session_id, expected_seq, list(messages), kwargs)
            return expected_seq + len(messages)
        return await self.inner.append_messages_atomic(session_id, expected_seq, messages, **kwargs)

    async def load_messages(self, session_id: str, **page: Any) -> list[Message]:
        self.pending = None  # the process that held it is gone
        return await self.inner.load_messages(session_id, **page)

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        self.pending = None
        return await self.inner.load_context(session_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_fails_on_a_store_that_acknowledges_write_one_before_it_is_durable() -> None:
    with pytest.raises(AssertionError) as failure:
        check_agent(
            agent_module(lookup, post),
            config=None,
            store=lambda directory: AcksWriteOneEarly(sqlite_store(directory / "s.db")),
        )
    text = str(failure.value)
    assert "unsafe tool 'post' ran 2 times in turn 1" in text
    assert "the kit, or the store given as store=, broke a rule" in text
    assert "a crash before append #2 (turn 1 step 1 write #2: 2 result(s))" in text
    requests = text.split("  requests:\n")[1].splitlines()
    posts = [line for line in requests if line.strip().startswith("POST https://api.example/posts")]
    assert len(posts) == 3  # turn 1's post, sent twice; turn 2's once


class DropsWriteOne(AcksWriteOneEarly):
    """A broken store: write #1 is acknowledged and never written."""

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: Sequence[Message], **kwargs: Any
    ) -> int:
        if messages[-1].role == "assistant" and messages[-1].tool_calls:
            return expected_seq + len(messages)
        stored = await self.inner.load_messages(session_id)
        return await self.inner.append_messages_atomic(session_id, len(stored), messages, **kwargs)


def test_fails_on_a_store_that_drops_write_one() -> None:
    with pytest.raises(AssertionError, match="check_agent: agent 'probe'"):
        check_agent(
            agent_module(lookup, post),
            config=None,
            store=lambda directory: DropsWriteOne(sqlite_store(directory / "s.db")),
        )


def test_fails_if_the_kit_ran_unsafe_orphans_again(monkeypatch: pytest.MonkeyPatch) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def forgetful(self: Any, calls: Any, *, resuming: bool = False, **kw: Any) -> Any:
        return await dispatch(self, calls, resuming=False, **kw)  # as if every orphan were safe

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", forgetful)
    # First found: a crash right after write #1, then the resume ran the post's orphan.
    with pytest.raises(AssertionError) as failure:
        check_agent(agent_module(lookup, post), config=None)
    assert re.search(
        r"the kit broke a rule: unsafe call post#\S+ lost its result in a crash.* — please "
        "report this",
        str(failure.value),
    )


# -- approvals ----------------------------------------------------------------------


@tool(requires_approval=True)
async def refund(args: Post, ctx: ToolContext) -> dict[str, Any]:
    """A side effect a person approves first, keyed."""
    response = await ctx.deps.http.post(
        "https://api.example/refunds",
        json={"text": args.text},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return {"status": response.status_code}


def _ran(report_requests: list[httpx.Request], path: str) -> int:
    return sum(1 for r in report_requests if r.url.path == path)


@pytest.mark.parametrize(
    ("decide", "crash_points"),
    [
        # lookup + refund, two turns. Approving: all at once 6 appends a turn (write #1, the
        # lookup's result, the decision, the claim, the refund's result, the reply), one
        # tool a step 7; denying: 5 and 6 (no claim). x2 sides.
        ("approve", (6 + 7) * 2 * 2),
        ("deny", (5 + 6) * 2 * 2),
        ("edit", (6 + 7) * 2 * 2),  # as approving: the edit is in the decision's write
        ("both", ((6 + 7) + (5 + 6)) * 2 * 2),
    ],
)
def test_sweeps_approval_bound_tools_through_decisions_and_claims(
    decide: Any, crash_points: int
) -> None:
    sent: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    report = check_agent(agent_module(lookup, refund), config=None, respond=respond, decide=decide)
    assert report.crash_points == crash_points
    assert report.approval_tools == ("refund",)
    assert (report.approved > 0) == (decide != "deny")
    assert (report.denied > 0) == (decide in ("deny", "both"))
    assert (report.edited > 0) == (decide == "edit")
    refunds = _ran(sent, "/refunds")
    if decide == "deny":
        assert refunds == 0  # a denied call never runs
    else:
        assert refunds > 0


def test_a_decide_callable_sees_each_waiting_call() -> None:
    seen: list[tuple[str, dict[str, Any], str]] = []

    def decide(pending: Any) -> bool:
        seen.append((pending.tool_name, pending.arguments, pending.digest))
        return len(seen) % 2 == 0  # deny, approve, deny, ...

    report = check_agent(agent_module(lookup, refund), config=None, turns=1, decide=decide)
    assert seen
    assert {name for name, _, _ in seen} == {"refund"}
    assert all(len(digest) == 64 for _, _, digest in seen)
    assert report.approved > 0
    assert report.denied > 0


def test_an_agent_without_approval_tools_is_swept_once() -> None:
    once = check_agent(agent_module(lookup, post), config=None, turns=1)
    assert once.crash_points == (3 + 5) * 2  # as before approvals: "both" needs none
    with pytest.raises(ConfigurationError, match="decide="):
        check_agent(agent_module(lookup, post), config=None, turns=1, decide="maybe")  # type: ignore[arg-type]


def test_fails_if_the_kit_ran_gated_calls_without_approval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_module = importlib.import_module("durable_agents._turn.approval_settling")
    monkeypatch.setattr(run_module.ApprovalSettler, "needing_approval", lambda self, calls: {})
    with pytest.raises(AssertionError, match=r"refund#\S+ \(run 1\) ran without a stored approval"):
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="approve")


def test_fails_if_the_kit_ran_denied_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def obeys_nobody(self: Any, calls: Any, **kw: Any) -> Any:
        decided = kw.get("decided") or {}
        kw["run"] = set(decided)  # every decided call runs, denied ones too
        return await dispatch(self, calls, **kw)

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", obeys_nobody)
    with pytest.raises(AssertionError, match=r"refund#\S+ \(run 1\) ran without a stored approval"):
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="deny")


def test_fails_if_the_kit_ran_an_approved_call_without_claiming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_module = importlib.import_module("durable_agents._turn.session_log")
    append = run_module.SessionLog.append

    async def no_claims(self: Any, messages: Any, **kw: Any) -> Any:
        approvals = [a for a in kw.pop("approvals", ()) if a.event != "claimed"]
        if not messages and not approvals and "approvals" not in kw:
            return None  # the claim write, dropped
        return await append(self, messages, approvals=approvals, **kw)

    monkeypatch.setattr(run_module.SessionLog, "append", no_claims)
    with pytest.raises(AssertionError, match=r"ran before its claim was stored"):
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="approve")


def test_fails_if_the_kit_ran_a_claimed_orphan_again(monkeypatch: pytest.MonkeyPatch) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def rerun(self: Any, calls: Any, *, resuming: bool = False, **kw: Any) -> Any:
        return await dispatch(self, calls, resuming=False, **kw)  # claimed orphans run again

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", rerun)
    # First found: a crash right after the claim landed; the resume ran the claimed call.
    with pytest.raises(AssertionError, match=r"unsafe call refund#\S+ lost its result in a crash"):
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="approve")


def test_fails_if_the_kit_ran_an_approved_call_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def twice(self: Any, calls: Any, **kw: Any) -> Any:
        if kw.get("run"):  # the approved calls just claimed: dispatched twice
            await dispatch(self, calls, **kw)
        return await dispatch(self, calls, **kw)

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", twice)
    with pytest.raises(AssertionError, match=r"approved call refund#\S+ ran 2 times"):
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="approve")


# -- edited approvals -------------------------------------------------------------------


def refunds_agent() -> tuple[ModuleType, list[httpx.Request], Any]:
    """The refund example, and a respond= for it that is its payments API (the module's dev
    stub) and keeps every request in the list."""
    refunds = importlib.import_module("examples.refunds.agent")
    sent: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        with contextlib.redirect_stdout(io.StringIO()):  # the stub's log lines
            status, body = refunds.payments_stub(
                request.method, request.url.path, request.content, dict(request.headers)
            )
        return httpx.Response(status, json=body)

    return refunds, sent, respond


def refunds_sent(sent: list[httpx.Request]) -> list[dict[str, Any]]:
    return [json.loads(r.content) for r in sent if r.method == "POST" and r.url.path == "/refunds"]


def test_an_edit_sweep_runs_each_approved_refund_with_the_edit_only() -> None:
    refunds, sent, respond = refunds_agent()
    report = check_agent(refunds, decide="edit", respond=respond)
    # As approving: write #1, the lookup's result, the decision (with the edit), the claim,
    # the refund's result, the reply; one tool a step 7. Two turns, x2 sides.
    assert report.crash_points == (6 + 7) * 2 * 2
    assert report.edited == report.approved > 0
    assert report.denied == 0
    schema = refunds.issue_refund.input_schema
    models = arguments_for(schema, validate=refunds.RefundRequest.model_validate)
    posted = refunds_sent(sent)
    assert posted
    assert models not in posted  # the model's refund never went out...
    assert all(body == posted[0] for body in posted)  # ...the approver's edit did
    refunds.RefundRequest.model_validate(posted[0])  # (made to fit the tool's schema)


def test_a_decide_callable_may_approve_with_its_own_arguments() -> None:
    sent: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    def decide(pending: Any) -> Any:
        return {**pending.arguments, "text": "approved, edited"}

    module = agent_module(lookup, refund)
    report = check_agent(module, config=None, turns=1, decide=decide, respond=respond)
    assert report.edited == report.approved > 0
    texts = {json.loads(r.content)["text"] for r in sent if r.url.path == "/refunds"}
    assert texts == {"approved, edited"}

    with pytest.raises(ConfigurationError, match=r"decide= gave arguments for refund#\S+ that do"):
        check_agent(module, config=None, turns=1, decide=lambda pending: {"text": ""})
    with pytest.raises(ConfigurationError, match=r"must return True, False or a dict"):
        check_agent(module, config=None, turns=1, decide=lambda pending: "yes")  # type: ignore[arg-type,return-value]


def test_fails_if_the_kit_ran_the_models_arguments_instead_of_the_edit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    result_content = run_module.ToolExecutor.result_content

    async def as_the_model_asked(self: Any, call: Any, *args: Any) -> Any:
        stored = next(c for m in self.history for c in m.tool_calls if c.id == call.id)
        return await result_content(self, stored, *args)  # the edit, dropped

    monkeypatch.setattr(run_module.ToolExecutor, "result_content", as_the_model_asked)
    with pytest.raises(AssertionError) as failure:
        check_agent(importlib.import_module("examples.refunds.agent"), decide="edit")
    text = str(failure.value)
    assert re.search(
        r"the kit broke a rule: approved call issue_refund#\S+ \(run 1\) ran with the model's "
        r"arguments, not the approver's edit: \{.*\}, where the edit is \{.*\} — please report",
        text,
    )
    assert "without a crash" in text


def test_fails_if_an_edited_calls_result_does_not_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    monkeypatch.setattr(run_module, "_ran_edited", lambda content, edited: content)
    with pytest.raises(AssertionError, match=r"which ran with an approver's edit, does not say so"):
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="edit")


def test_fails_if_the_edit_is_not_stored_with_the_approval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    approvals = importlib.import_module("durable_agents.approvals")
    monkeypatch.setattr(approvals, "_checked_edit", lambda call, arguments, agent: call.arguments)
    with pytest.raises(AssertionError) as failure:
        check_agent(agent_module(lookup, refund), config=None, turns=1, decide="edit")
    assert re.search(
        r"the kit broke a rule: call refund#\S+ was approved with edited arguments "
        r"\{'text': '\w+'\}; the stored approval has None",
        str(failure.value),
    )


@tool(safe_to_retry=True, requires_approval=True)
async def export_report(args: Query, ctx: ToolContext) -> dict[str, Any]:
    """A read a person approves first (it exports what it reads)."""
    response = await ctx.deps.http.get(f"https://api.example/exports/{args.q}")
    return {"status": response.status_code}


def test_a_safe_gated_tools_edited_orphan_runs_again_with_the_edit() -> None:
    """Found by the edit sweep: a claimed orphan of a safe gated tool once ran again with
    the model's arguments (only unclaimed calls carried their decision)."""
    check_agent(agent_module(export_report), config=None, turns=1, decide="edit")


# -- approval-gated tools wherever they are declared (issue 22) -----------------------
#
# A dentist's booking agent: a read, a booking a person approves, an SMS. The kit stores
# a step's results in the order it has them: the calls needing no decision in write #2,
# the approved (or denied) ones after the decision. So a gated tool declared first or in
# the middle is answered last, and the check must take that order as the kit's own.


class Day(BaseModel):
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")  # no default: TestLLM fills it


class Booking(BaseModel):
    slot: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$")
    patient: str = Field(min_length=2, max_length=80)


class Sms(BaseModel):
    to: str = Field(pattern=r"^\+\d{8,15}$")
    text: str = Field(min_length=1, max_length=160)


@tool(safe_to_retry=True)
async def find_slots(args: Day, ctx: ToolContext) -> list[str]:
    """Free slots on a day."""
    day = date.fromisoformat(args.date)  # a real date, or the handler fails
    response = await ctx.deps.http.get(f"https://clinic.example/slots?date={day}")
    return [f"{day}T09:00"] if response.status_code == 200 else []


@tool(requires_approval=True)
async def book_slot(args: Booking, ctx: ToolContext) -> dict[str, Any]:
    """Book a slot (a person approves first)."""
    response = await ctx.deps.http.post(
        "https://clinic.example/bookings",
        json={"slot": args.slot, "patient": args.patient},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return {"status": response.status_code}


@tool
async def send_sms(args: Sms, ctx: ToolContext) -> dict[str, Any]:
    """Text the patient, keyed."""
    response = await ctx.deps.http.post(
        "https://sms.example/messages",
        json={"to": args.to, "text": args.text},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return {"status": response.status_code}


@tool(requires_approval=True)
async def charge_deposit(args: Booking, ctx: ToolContext) -> dict[str, Any]:
    """Take a deposit (a person approves first)."""
    response = await ctx.deps.http.post(
        "https://pay.example/deposits",
        json={"patient": args.patient},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return {"status": response.status_code}


@pytest.mark.parametrize(
    ("tools", "decide"),
    [
        ((book_slot, find_slots, send_sms), "all"),  # the default: approve, deny, edit
        ((find_slots, book_slot, send_sms), "both"),  # (approve and deny: quicker)
        ((find_slots, send_sms, book_slot), "both"),
    ],
    ids=["gated-first", "gated-middle", "gated-last"],
)
def test_a_gated_tool_passes_wherever_it_is_declared(tools: tuple[Any, ...], decide: Any) -> None:
    sent: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    report = check_agent(agent_module(*tools), config=None, respond=respond, decide=decide)
    assert report.approval_tools == ("book_slot",)
    assert report.approved > 0
    assert report.denied > 0
    assert (report.edited > 0) == (decide == "all")
    assert report.durability_errors > 0
    assert report.safe_reinvocations > 0
    # TestLLM's arguments reached the handlers: a real date, a booking, an SMS.
    assert any(r.url.path == "/slots" and r.url.params["date"] == "1111-11-11" for r in sent)
    assert any(r.url.path == "/bookings" for r in sent)
    assert any(r.url.path == "/messages" for r in sent)


def test_two_gated_tools_in_one_step_with_mixed_decisions() -> None:
    def decide(pending: Any) -> bool:  # the booking approved, the deposit denied
        return bool(pending.tool_name == "book_slot")

    module = agent_module(charge_deposit, find_slots, book_slot, send_sms)
    mixed = check_agent(module, config=None, decide=decide)
    assert mixed.approval_tools == ("book_slot", "charge_deposit")
    assert mixed.approved > 0
    assert mixed.denied > 0
    both = check_agent(module, config=None, turns=1, decide="both")  # approved, then denied
    assert both.approved > 0
    assert both.denied > 0


def _refused(monkeypatch: pytest.MonkeyPatch, method: str, replace: Any) -> str:
    """check_agent's failure on the dentist's agent (gated tool first) with one method of
    the run loop replaced by `replace(original)`."""
    owner = {  # the class of the run loop's part that has the method
        "settle": importlib.import_module("durable_agents._turn.approval_settling").ApprovalSettler,
        "dispatch": importlib.import_module("durable_agents._turn.tool_execution").ToolExecutor,
    }[method]
    original = getattr(owner, method)
    monkeypatch.setattr(owner, method, replace(original))
    with pytest.raises(AssertionError) as failure:
        check_agent(
            agent_module(book_slot, find_slots, send_sms), config=None, turns=1, decide="approve"
        )
    monkeypatch.undo()
    return str(failure.value)


def test_a_bad_history_is_still_refused_and_blamed_on_the_kit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (A result stored twice never gets that far: the store refuses it.)
    def forgets_decided_calls(settle: Any) -> Any:  # the approved call is never answered
        async def wrapped(self: Any, orphans: Any, message: Any) -> Any:
            return []

        return wrapped

    text = _refused(monkeypatch, "settle", forgets_decided_calls)
    assert re.search(
        r"the kit broke a rule: message 1: 3 calls, but only 2 results follow it directly "
        r"\(none for book_slot#\S+\); message 4 \(assistant\) comes next — please report this",
        text,
    )
    assert "your agent" not in text

    def strays(dispatch: Any) -> Any:  # write #2 also answers a call of no step
        async def wrapped(self: Any, calls: Any, **kw: Any) -> Any:
            results = await dispatch(self, calls, **kw)
            if kw.get("budgeted") and results:
                stray = Message.tool_result(ToolCall("call_stray", "send_sms", {}), "{}")
                return [*results, stray]
            return results

        return wrapped

    text = _refused(monkeypatch, "dispatch", strays)
    assert "the kit broke a rule: message 4: the result of send_sms#call_stray follows" in text
