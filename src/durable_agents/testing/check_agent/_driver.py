"""The entry points: `check_agent` and `check_agent_async` set the check up, then sweep
every crash point of every mode and decision policy (`sweep`)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from ..._schema.formats import Steer, steered_formats
from ...stores.base import Store
from ._breach import never_completed
from ._children import AgentsArg
from ._config import check_setup
from ._decisions import DecidePolicy, sweeps
from ._player import Player
from ._report import AgentCheckReport
from ._scenario import SIDES, Crash, Scenario, append_labels
from ._transport import Responder


async def check_agent_async(
    module: ModuleType | str,
    *,
    config: str | os.PathLike[str] | None = "wrangler.toml",
    env: Mapping[str, Any] | None = None,
    turns: int = 2,
    respond: Responder | None = None,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
    store: Callable[[Path], Store] | None = None,
    decide: DecidePolicy = "all",
    values: Mapping[Any, Any] | None = None,
    expect_incomplete: Collection[str] = (),
    agents: AgentsArg | None = None,
) -> AgentCheckReport:
    """`check_agent`, awaitable (for async tests). Same arguments, same report."""
    started = time.monotonic()
    setup = check_setup(module, config, env)
    options = setup.options  # the module's CHECK_AGENT, under what the caller gives
    arguments = {**options.get("arguments", {}), **(arguments or {})}
    steers = _steers(options.get("values"), values)
    expected = _names(options.get("expect_incomplete", ())) | _names(expect_incomplete)
    with tempfile.TemporaryDirectory(prefix="check-agent-") as directory:
        backend = _open_store(store, Path(directory))
        forward = httpx.AsyncClient(timeout=30.0) if setup.servers else None
        try:
            player = Player(
                setup,
                backend,
                turns=turns,
                respond=respond,
                arguments=arguments,
                own_store=store is not None,
                forward=forward,
                steers=steers,
                expect_incomplete=expected,
                agents=agents,
                config=config,
                env=env,
            )
            await player.list_toolsets()
            for policy, decider in sweeps(player.gated, decide):
                player.decide = decider
                for one_per_step in (False, True):
                    await sweep(player, one_per_step, policy)
        finally:
            if forward is not None:
                await forward.aclose()
            close = getattr(backend, "close", None)
            if close is not None:
                await close()
    children = player.children.values()
    tools = [
        *setup.agent.tools,
        *player.listed.values(),
        *(t for c in children for t in c.report_tools()),
    ]
    report = player.tally.report(
        setup.agent.name,
        tools,
        list(player.listed),
        time.monotonic() - started,
        player.expect_incomplete,
        list(player.children),
    )
    if report.never_completed:
        raise never_completed(report, {t.name: t for t in tools}, player.arguments)
    return report


def _steers(
    module_values: Mapping[Any, Any] | None, values: Mapping[Any, Any] | None
) -> dict[str, Steer]:
    """The formats steered: the module's `CHECK_AGENT["values"]`, each under the caller's
    `values=` for the same format."""
    return {**steered_formats(module_values), **steered_formats(values)}


def _names(expect_incomplete: Collection[str]) -> set[str]:
    """`expect_incomplete=` as a set of names (one name alone is taken as such, not as
    its letters)."""
    if isinstance(expect_incomplete, str):
        return {expect_incomplete}
    return set(expect_incomplete)


def _open_store(store: Callable[[Path], Store] | None, directory: Path) -> Store:
    """The store to check on: `store(directory)`, else a SQLite file in `directory`."""
    if store is not None:
        return store(directory)
    # Imported here, not above: in workerd (tests/runtime) the check runs on D1, and the
    # SQLite store's `sqlite3` need not load there.
    from ...stores.sqlite import sqlite_store

    return sqlite_store(directory / "check_agent.db")


async def sweep(player: Player, one_per_step: bool, policy: str = "approve") -> None:
    """One mode under one decision policy: the uncrashed play (every tool must run), then
    one play per append of it and per side of that append."""
    mode = f"one_per_step={one_per_step}"
    if policy != "approve":
        mode += f", decisions: {policy}"
    prefix = f"check-{policy}-{'steps' if one_per_step else 'batch'}"
    baseline = Scenario(f"{prefix}-baseline", mode, None, policy)
    history = await player.play(baseline, one_per_step)
    await player.check(baseline, history)
    player.tally.requests += _requests(baseline)
    await _assert_every_tool_ran(player, baseline, history)
    labels = append_labels(baseline.appends, baseline.approval_writes, baseline.append_sessions)
    for n, label in enumerate(labels, 1):
        for when in SIDES:
            crash = Crash(n, when, label)
            scenario = Scenario(f"{prefix}-{n}-{when}", mode, crash, policy)
            history = await player.play(scenario, one_per_step)
            await player.check(scenario, history)
            player.tally.crash_points += 1
            player.tally.child_crash_points += label.startswith("child ")
            player.tally.requests += _requests(scenario)


def _requests(scenario: Scenario) -> int:
    """The requests sent in a play: by the agent's handlers and by its child agents'."""
    return len(scenario.requests) + sum(len(c.requests) for c in scenario.children.values())


async def _assert_every_tool_ran(player: Player, baseline: Scenario, history: list[Any]) -> None:
    """Every tool not denied ran in the uncrashed play (a child agent's in one of its
    sessions): else it would go unchecked."""
    covered = {i.tool_name for c in baseline.children.values() for i in c.invocations}
    for session, played in baseline.children.items():  # a child's denied calls never run
        for message in await player.store.load_messages(session):
            covered |= {c.name for c in message.tool_calls if not played.decisions.get(c.id, True)}
    for child in player.children.values():
        idle = sorted(set(child.tools) - covered)
        if idle:
            raise player.breach(
                baseline,
                f"tools {idle} of agent {child.name!r} (of agents=) never ran in the uncrashed "
                "play, so they would go unchecked: does an agent tool of the checked agent "
                "call it, and do its arguments fit?",
                history,
                blame="agent",
            )
    ran = {i.tool_name for i in baseline.invocations}
    denied = {
        c.name for m in history for c in m.tool_calls if not baseline.decisions.get(c.id, True)
    }
    for name in sorted({*player.tools, *player.listed} - ran - denied):
        result = next((m.content for m in history if m.tool_name == name), "no call")
        hint = (
            "the arguments= given for it do not fit its input schema"
            if name in player.given
            else "see why in its result"
        )
        raise player.breach(
            baseline,
            f"TestLLM's call of tool {name!r} never reached its handler ({result}); so it "
            f"would go unchecked: {hint}",
            history,
            blame="agent",
        )


def check_agent(
    module: ModuleType | str,
    *,
    config: str | os.PathLike[str] | None = "wrangler.toml",
    env: Mapping[str, Any] | None = None,
    turns: int = 2,
    respond: Responder | None = None,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
    store: Callable[[Path], Store] | None = None,
    decide: DecidePolicy = "all",
    values: Mapping[Any, Any] | None = None,
    expect_incomplete: Collection[str] = (),
    agents: AgentsArg | None = None,
) -> AgentCheckReport:
    """Run an agent module at every crash point and check the at-most-once contract.

    `module`: the agent module (or its import name), e.g.
    `importlib.import_module("agent")` for `src/agent.py`. `config`: the
    wrangler.toml whose `[vars]` make the env (None: no settings; a relative
    path not found from the current directory is looked for in the folders
    above the module); `env`: settings added or overriding them (a toolset's
    server URL, e.g. `env={"MCP_URL": ...}`: its requests are forwarded to it).
    `turns`: turns per session. `respond(request) -> httpx.Response` answers
    the handlers' requests other than a toolset server's (default: the
    module's `DEV_STUBS` for the settings they serve, else `200 {}`).
    `arguments`: `{tool name: arguments}` for tools whose arguments `TestLLM`
    cannot make from the schema (it says which field, e.g. a pattern with a
    lookahead), or that you want fixed. `store(dir)`: the
    store to run on (default: a SQLite file in a temporary directory).
    `decide`: how waiting calls of `requires_approval` tools are decided:
    `"all"` (default: one sweep approving them all, one denying them all, one
    approving them all with edited arguments), `"approve"`, `"deny"`, `"edit"`,
    `"both"` (approve, then deny), or `decide(PendingApproval) -> bool | dict`
    (a dict approves the call with those arguments instead of the model's).
    `values`: `{format or type: value}`, the values `TestLLM` makes for a
    JSON-schema format, as `TestLLM(values=)` takes them: `{"date-time":
    "future"}` (a week after the check starts), `{"email": "ann@example.org"}`.
    `expect_incomplete`: names of side effects that may never complete in the
    check (see below). `agents`: the agents its agent tools call, as
    `run(agents=)` takes them (`{"refunds": refunds_agent}` or a `LocalAgent` with
    its deps and handlers; TestLLM drives them too), or their agent modules (set
    up as `module` is: env, dev stubs, `make_deps`); those no agent tool reaches
    are left out. Their turns run on the same store, every write of theirs is a
    crash point as the parent's are (a crash there kills the parent's run too),
    their calls that wait for approval are decided from the parent's session by
    `decide`, and each call's child turn is checked to have run once, its side
    effects at most once, its answer (or, after a denial, its model's) the call's
    result.

    Returns an `AgentCheckReport` (`report.tools[name]`: how far each tool's
    calls got); raises `AssertionError` with the crash point, the stored
    history and the requests on the first breach (what is checked:
    docs/testing.md, "`check_agent`: any agent at every crash point"), and,
    after the sweeps, when a tool that is not `safe_to_retry` never completed
    (its handler never returned: every run raised `ModelRetry` or failed, or
    it was never called), naming the tool, what happened instead and how to
    fix it, unless `expect_incomplete` names it or a person denied its every
    call; a safe tool that never completed is a warning in the report.
    Runs its own event loop: from async code, `await check_agent_async(...)`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "check_agent() runs its own event loop; in async code use "
            "`await check_agent_async(...)`"
        )
    return asyncio.run(
        check_agent_async(
            module,
            config=config,
            env=env,
            turns=turns,
            respond=respond,
            arguments=arguments,
            store=store,
            decide=decide,
            values=values,
            expect_incomplete=expect_incomplete,
            agents=agents,
        )
    )
