"""`check_agent` says how far each tool got, fails when a side effect never completed, and
`TestLLM`'s values can be steered per format (`values=`) so that it does.

The scenario of issue 32: `TestLLM` filled every `datetime` with 2000-01-01, a loans
desk's `renew_loan` sent every call back with `ModelRetry` for a past date, its POST never
ran, and the check passed without a word.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, EmailStr, Field

from durable_agents import Agent, ConfigurationError, ModelRetry, ToolContext, run, tool
from durable_agents.llm.offline import arguments_for
from durable_agents.testing import TestLLM, check_agent
from durable_agents.testing.check_agent import ToolCounts
from durable_agents.testing.check_agent._report import Tally


class Renewal(BaseModel):
    loan_id: str
    until: datetime.datetime


class Query(BaseModel):
    q: str


@tool
async def renew_loan(args: Renewal, ctx: ToolContext) -> str:
    """Renew a loan until a later day: the library's POST, keyed."""
    if args.until <= ctx.now:
        raise ModelRetry(f"pick a future date: {args.until:%Y-%m-%d} is past")
    await ctx.deps.http.post(
        "https://library.example/renewals",
        json={"loan": args.loan_id, "until": args.until.isoformat()},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return "renewed"


def agent_module(*tools: Any, **extra: Any) -> ModuleType:
    module = ModuleType("loans_desk")
    module.AGENT = Agent("loans", "Run the loans desk.", list(tools))  # type: ignore[attr-defined]
    module.make_deps = lambda env, http: SimpleNamespace(http=http)  # type: ignore[attr-defined]
    for name, value in extra.items():
        setattr(module, name, value)
    return module


# -- the rule: a side effect that never completed fails the check ------------------------


def test_a_side_effect_that_never_completes_fails_naming_the_tool_and_the_fix() -> None:
    with pytest.raises(AssertionError) as failure:
        check_agent(agent_module(renew_loan), config=None, turns=1)
    text = str(failure.value)
    assert text.startswith("check_agent: agent 'loans':\n")
    # One tool, one turn: 3 appends, x2 sides, x2 modes (the same for one tool) = 12 crash
    # points and 2 plays without a crash; a crash right after write #1 leaves a call that
    # never runs (a durability error), so 14 calls and 12 runs, each sent back.
    assert (
        "your agent broke a rule: tool 'renew_loan' is a side effect (not safe_to_retry) and "
        "its handler never completed in the check (14 calls, 12 runs of its handler: 12 "
        "ModelRetry('pick a future date: 2000-01-01 is past'))" in text
    )
    assert 'TestLLM called it with {"loan_id": "a", "until": "2000-01-01T00:00:00Z"}' in text
    assert 'check_agent(module, values={"date-time": "future"})' in text
    assert 'check_agent(module, arguments={"renew_loan": {"loan_id": "a", "until": ' in text
    assert "check_agent(module, expect_incomplete={'renew_loan'})" in text
    assert "respond=" not in text  # nothing failed: the requests are not the problem
    row = next(line for line in text.splitlines() if line.strip().startswith("renew_loan"))
    assert row.split() == [
        "renew_loan", "side", "effect", "14", "0", "12", "0", "0", "-", "-", "never", "completed",
    ]  # fmt: skip


def test_future_dates_make_it_complete_and_the_report_counts_each_run() -> None:
    sent: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    report = check_agent(
        agent_module(renew_loan),
        config=None,
        turns=1,
        respond=respond,
        values={datetime.datetime: "future"},
    )
    counts = report.tools["renew_loan"]
    assert (counts.calls, counts.completed, counts.retried, counts.failed) == (14, 12, 0, 0)
    assert counts.runs == 12
    assert counts.outcomes == ()
    assert len(sent) == 12  # each completed run posted once: the side effect was seen
    week = datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=7)
    assert {r.content for r in sent} == {f'{{"loan":"a","until":"{week}T00:00:00+00:00"}}'.encode()}
    assert report.never_completed == ()
    assert report.warnings == ()
    lines = str(report).splitlines()
    assert lines[1].split() == [
        "tool", "kind", "calls", "completed", "ModelRetry", "failed", "invalid", "args",
        "approved", "denied",
    ]  # fmt: skip
    assert lines[2].split() == ["renew_loan", "side", "effect", "14", "12", "0", "0", "0", "-", "-"]


def test_the_agent_module_may_carry_the_checks_options() -> None:
    steered = agent_module(renew_loan, CHECK_AGENT={"values": {"date-time": "future"}})
    assert check_agent(steered, config=None, turns=1).tools["renew_loan"].completed == 12
    # What the caller gives goes on top: by hand, a past date again.
    past = {"renew_loan": {"loan_id": "b", "until": "2001-01-01T00:00:00Z"}}
    with pytest.raises(AssertionError, match=r"ModelRetry\('pick a future date: 2001-01-01"):
        check_agent(steered, config=None, turns=1, arguments=past)
    excused = agent_module(renew_loan, CHECK_AGENT={"expect_incomplete": ["renew_loan"]})
    report = check_agent(excused, config=None, turns=1)
    assert report.expect_incomplete == ("renew_loan",)
    assert "never completed (expected)" in str(report)

    for bad, said in [
        ("future", r"CHECK_AGENT must be a dict of check_agent's options"),
        ({"valuez": {}}, r"CHECK_AGENT has \['valuez'\]; it may hold 'arguments'"),
        ({"values": ["date-time"]}, r"CHECK_AGENT\['values'\] must be \{format or type: value\}"),
        ({"expect_incomplete": "renew_loan"}, r"must be a set of tool names"),
    ]:
        with pytest.raises(ConfigurationError, match=said):
            check_agent(agent_module(renew_loan, CHECK_AGENT=bad), config=None, turns=1)


# -- the counts of tools that retry, fail, time out, or are denied --------------------


@tool(safe_to_retry=True)
async def search_catalog(args: Query, ctx: ToolContext) -> str:
    """A read that always sends the model back."""
    raise ModelRetry("say which genre")


@tool
async def charge_fee(args: Query, ctx: ToolContext) -> str:
    """A side effect whose payment API always declines."""
    raise RuntimeError("card declined")


@tool(safe_to_retry=True, timeout=0.01)
async def slow_read(args: Query, ctx: ToolContext) -> str:
    """A read past its timeout every time."""
    await asyncio.sleep(5)
    return "late"


@tool
async def send_reminder(args: Query, ctx: ToolContext) -> str:
    """A side effect that completes."""
    await ctx.deps.http.post(
        "https://mail.example/send", headers={"Idempotency-Key": ctx.idempotency_key}
    )
    return "sent"


def test_each_tool_is_counted_by_how_its_runs_ended() -> None:
    module = agent_module(search_catalog, charge_fee, slow_read, send_reminder)
    with pytest.raises(AssertionError) as failure:  # charge_fee: a side effect, never done
        check_agent(module, config=None, turns=1)
    text = str(failure.value)
    assert "tool 'charge_fee' is a side effect" in text
    assert re.search(r"\d+ runs of its handler: \d+ RuntimeError\('card declined'\)\)", text)
    assert "answer its requests as its API would: respond=" in text  # it failed
    assert "values=" not in text  # no format in its schema to steer
    assert "search_catalog" not in text.split("  tools (")[0]  # a read: only in the table

    report = check_agent(module, config=None, turns=1, expect_incomplete="charge_fee")
    tools = report.tools
    assert list(tools) == ["search_catalog", "charge_fee", "slow_read", "send_reminder"]
    search, charge, slow, reminder = tools.values()
    assert search.safe_to_retry
    assert search.completed == search.failed == 0
    assert search.retried == search.runs > 0
    assert search.outcomes == (("ModelRetry('say which genre')", search.runs),)
    assert charge.completed == charge.retried == 0
    assert charge.failed == charge.runs > 0
    assert charge.outcomes == (("RuntimeError('card declined')", charge.runs),)
    assert slow.failed == slow.runs > 0
    assert slow.outcomes == (("stopped after its timeout (0.01 s)", slow.runs),)
    assert reminder.completed == reminder.runs > 0
    assert reminder.outcomes == ()
    # Every tool was called in every play; a safe one runs again after a crash lost its
    # result, an unsafe one never runs again (and not at all after a crash right after
    # write #1).
    assert search.calls == charge.calls == slow.calls == reminder.calls
    assert search.runs > search.calls > charge.runs
    assert report.never_completed == ()
    assert report.warnings == (
        f"warning: safe tool 'search_catalog' never completed: {search.calls} calls, "
        f"{search.runs} runs of its handler: {search.runs} ModelRetry('say which genre')",
        f"warning: side effect 'charge_fee' never completed (expected): {charge.calls} "
        f"calls, {charge.runs} runs of its handler: {charge.runs} RuntimeError('card "
        "declined')",
        f"warning: safe tool 'slow_read' never completed: {slow.calls} calls, {slow.runs} "
        f"runs of its handler: {slow.runs} stopped after its timeout (0.01 s)",
    )
    assert str(report).endswith("\n".join(report.warnings))
    assert "never completed (expected)" in report.table()

    with pytest.raises(ConfigurationError, match=r"expect_incomplete= names tools .* \['nope'\]"):
        check_agent(module, config=None, turns=1, expect_incomplete={"charge_fee", "nope"})


@tool(requires_approval=True)
async def waive_fine(args: Query, ctx: ToolContext) -> str:
    """A side effect a librarian approves first."""
    await ctx.deps.http.post(
        "https://library.example/waivers", headers={"Idempotency-Key": ctx.idempotency_key}
    )
    return "waived"


def test_decisions_are_counted_and_an_all_denied_side_effect_is_a_warning() -> None:
    both = check_agent(agent_module(waive_fine), config=None, turns=1, decide="both")
    waive = both.tools["waive_fine"]
    assert waive.requires_approval
    assert waive.approved == both.approved > 0
    assert waive.denied == both.denied > 0
    assert 0 < waive.completed <= waive.approved
    denied = check_agent(agent_module(waive_fine), config=None, turns=1, decide="deny")
    assert denied.tools["waive_fine"].completed == 0
    assert denied.never_completed == ()  # denying every call was the caller's choice
    (warning,) = denied.warnings
    assert warning.startswith("warning: side effect 'waive_fine' never ran: every call denied")


def test_a_tool_never_called_and_one_refused_for_its_arguments_are_said_so() -> None:
    # (check_agent stops at once on both, before its sweeps: TestLLM's call of every tool
    # must reach its handler without a crash. The counts behind the report still say it.)
    tally = Tally()
    report = tally.report("loans", [renew_loan, search_catalog], [], 0.0)
    assert report.tools["renew_loan"] == ToolCounts("renew_loan", safe_to_retry=False)
    assert report.never_completed == ("renew_loan",)
    assert "never called" in report.table()
    assert report.warnings == (
        "warning: safe tool 'search_catalog' never called: 0 calls, 0 runs of its handler: none",
    )


# -- steering TestLLM's values ---------------------------------------------------------

IN_2031 = datetime.datetime(2031, 3, 4, 15, 30, tzinfo=datetime.UTC).timestamp()


async def test_future_is_relative_to_the_clock_the_run_uses() -> None:
    agent = Agent("loans", "Renew.", [renew_loan])
    deps = SimpleNamespace(http=httpx.AsyncClient(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json={})
    )))  # fmt: skip
    steered = TestLLM(values={"date-time": "future"}, clock=lambda: IN_2031)
    done = await run(agent, llm=steered, message="renew", deps=deps, clock=lambda: IN_2031)
    (call,) = [c for m in done.messages for c in m.tool_calls]
    assert call.arguments["until"] == "2031-03-11T00:00:00Z"
    assert [m.content for m in done.messages if m.role == "tool"] == ["renewed"]
    # The same steer read from the system clock: a week from today, before 2031's now.
    unaware = TestLLM(values={"date-time": "future"})
    done = await run(agent, llm=unaware, message="renew", deps=deps, clock=lambda: IN_2031)
    (result,) = [m.content for m in done.messages if m.role == "tool"]
    assert '"kind": "tool-retry"' in result
    await deps.http.aclose()


NOW = datetime.datetime(2030, 5, 5, 12, 0, tzinfo=datetime.UTC)


def test_values_steer_formats_by_name_or_by_type() -> None:
    class Loan(BaseModel):
        due: datetime.date
        returned: datetime.datetime = datetime.datetime(2000, 1, 1)  # a steer wins over it
        reminder: datetime.datetime | None = None  # ...not over None
        ids: list[datetime.date] = Field(min_length=3, json_schema_extra={"uniqueItems": True})
        contact: str = Field(json_schema_extra={"format": "email"})
        slot: datetime.time

    made = arguments_for(
        Loan.model_json_schema(),
        values={
            datetime.date: "past",
            "date-time": lambda now: now + datetime.timedelta(hours=1),
            EmailStr: "reader@library.example",
            datetime.time: datetime.time(9, 30),
        },
        now=NOW,
        validate=Loan.model_validate,
    )
    assert made == {
        "due": "2030-04-28",
        "returned": "2030-05-05T13:00:00Z",
        "reminder": None,
        "ids": ["2030-04-28", "2030-04-27", "2030-04-26"],  # a day further each
        "contact": "reader@library.example",
        "slot": "09:30:00",
    }
    assert arguments_for(Loan.model_json_schema())["due"] == "2000-01-01"  # unsteered


def test_a_steered_value_that_breaks_the_schema_names_the_field() -> None:
    class Card(BaseModel):
        holder: str = Field(json_schema_extra={"format": "email"}, max_length=12)

    schema = Card.model_json_schema()
    with pytest.raises(ConfigurationError) as long:
        arguments_for(schema, tool_name="issue_card", values={"email": "reader@library.example"})
    text = str(long.value)
    assert "tool 'issue_card'" in text
    assert "$.holder: the value values= gives the format 'email' breaks its schema" in text
    assert "Change values= (the formats it steers)" in text
    broken = r"\$\.until: .*'date-time' breaks its schema \(its presets: 'future', 'past'\): must"
    with pytest.raises(ConfigurationError, match=broken):
        arguments_for(Renewal.model_json_schema(), values={"date-time": "next week"}, now=NOW)
    raised = r"\$\.until: values= for the format 'date-time' raised ZeroDivisionError"
    with pytest.raises(ConfigurationError, match=raised):
        arguments_for(Renewal.model_json_schema(), values={"date-time": lambda now: 1 / 0})
    # In check_agent, before any run: the tool and the field named.
    with pytest.raises(ConfigurationError, match=r"tool 'renew_loan'.*\n  \$\.until: the value"):
        check_agent(agent_module(renew_loan), config=None, values={"date-time": "tomorrow"})


def test_a_values_key_or_value_that_cannot_steer_is_refused_at_once() -> None:
    for values, said in [
        ({int: "1"}, r"values= keys are JSON-schema formats .*; 'int' has no format"),
        ({"email": "future"}, r"the presets \['future', 'past'\] are for the formats"),
        ({"uuid": 7}, r"values=\{'uuid': \.\.\.\}: 7 is not a string"),
        ({"date": "future", datetime.date: "past"}, r"steers the format 'date' twice"),
    ]:
        with pytest.raises(ConfigurationError, match=said):
            TestLLM(values=values)
    with pytest.raises(ConfigurationError, match="'int' has no format"):
        check_agent(agent_module(renew_loan), config=None, values={int: "1"})


def test_an_approvers_edit_is_made_with_the_steered_values_too() -> None:
    gated = tool(requires_approval=True)(renew_loan.handler)
    report = check_agent(
        agent_module(gated), config=None, turns=1, decide="edit", values={"date-time": "future"}
    )
    counts = report.tools["renew_loan"]
    assert counts.approved == report.edited > 0  # the edits: the next day, still ahead
    assert counts.completed > 0
    assert counts.retried == 0
