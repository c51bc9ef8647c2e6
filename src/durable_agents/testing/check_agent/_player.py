"""Playing one scenario: the agent's turns on one session, through the crashing store,
deciding waiting calls and resuming after the crash as a caller would; then checking what
was stored and run against the rules (the `_check_*` modules)."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Collection, Mapping
from typing import Any

import httpx

from ..._schema.formats import Steer
from ..._schema.values import example_arguments
from ...agent_tools import LocalAgent
from ...approvals import approval_states
from ...errors import ConfigurationError
from ...llm.offline import TestLLM
from ...messages import Message
from ...run import pending_tool_calls, run
from ...session_links import agent_tool_agents
from ...stores.base import Store
from ...tools import Tool
from ..crash_points import CrashingStore, SimulatedCrash
from ._breach import AgentBreach, Blame, breach
from ._check_approvals import assert_approvals
from ._check_calls import assert_calls
from ._check_children import assert_children
from ._check_history import assert_well_formed
from ._check_server_calls import assert_server_calls
from ._children import AgentsArg, ChildAgent, ChildSetup, child_agents, child_sessions
from ._config import CheckSetup
from ._decisions import Approver, ArgumentEditor, Decider, decide_waiting
from ._listing import toolset_tools
from ._recording import RecordingStore, RecordingToolset, recorded_handler
from ._report import Tally
from ._rules import ToolRules
from ._scenario import Scenario, Stage
from ._transport import CheckTransport, Responder

_MAX_RUNS_PER_TURN = 50  # resumes of one turn before giving up (max_steps agents resume)
# Statuses only the agent's own code or settings can cause with TestLLM, and where to look.
_AGENT_STATUSES = {
    "error": ": TestLLM does not fail, so something of the agent's did (its "
    "history_processor or summarize, or a toolset: is its server still up?)",
    "budget_exceeded": ": the agent's max_session_tokens is too small for the check's turns",
}


class Player:
    """Plays scenarios of one agent on one store and checks each; keeps the `tally`."""

    def __init__(
        self,
        setup: CheckSetup,
        store: Store,
        *,
        turns: int,
        respond: Responder | None,
        arguments: Mapping[str, Mapping[str, Any]],
        own_store: bool = False,
        forward: httpx.AsyncClient | None = None,
        steers: Mapping[str, Steer] | None = None,
        expect_incomplete: Collection[str] = (),
        agents: AgentsArg | None = None,
        config: str | os.PathLike[str] | None = None,
        env: Mapping[str, Any] | None = None,
    ) -> None:
        """`config`, `env`: as check_agent got them, for the agent modules in `agents=`."""
        agent = self.agent = setup.agent
        self.stage = Stage()
        self.store = store
        self.make_deps = setup.make_deps
        self.env = setup.env
        self.settings = setup.run_settings  # run(settings=): what the toolsets read
        self.transport = CheckTransport(
            self.stage, respond=respond, stubs=setup.stubs, servers=setup.servers, forward=forward
        )
        # What run() is given: the agent, its toolsets listing through the recorder.
        self.run_agent = (
            dataclasses.replace(
                agent,
                toolsets=[RecordingToolset(ts, self.stage, store) for ts in agent.toolsets],
            )
            if agent.toolsets
            else agent
        )
        self.decide: Decider = lambda pending: True
        self.messages = [f"check_agent turn {i + 1}" for i in range(turns)]
        self.own_store = own_store
        self.arguments = {name: dict(value) for name, value in arguments.items()}
        self.given = set(self.arguments)
        self.expect_incomplete = set(expect_incomplete)
        # values= steers the formats TestLLM's arguments (and the edits) are made with, at
        # the time the check starts: its runs' clock is the system's.
        self.steers = dict(steers or {})
        self.now = datetime.datetime.now(datetime.UTC)
        self.tools = {t.name: t for t in agent.tools}
        self.listed: dict[str, Tool] = {}  # the toolsets' tools, as listed before the check
        self.rules = ToolRules(self.tools, self.listed)
        self.editor = ArgumentEditor(self.rules, self.steers, self.now)
        self.tally = Tally()
        if not agent.toolsets:  # (else once they are listed: `list_toolsets`)
            self._check_given()
        self._check_handlers()
        for name, t in self.tools.items():  # made once, checked against the tool's model
            if name not in self.arguments:
                self.arguments[name] = self._made_own(t)
        self.handlers = {
            name: recorded_handler(t, self.stage, store) for name, t in self.tools.items()
        }
        # The agents its agent tools call: their turns run on the same store, crashing too.
        self.agent_tools = agent_tool_agents(agent)
        self.children = child_agents(
            agent, agents, ChildSetup(self.stage, store, self._made_own, config, env)
        )
        self.approvers = {None: Approver(self.editor, agent)} | {
            name: Approver(ArgumentEditor(c.rules, self.steers, self.now), c.agent)
            for name, c in self.children.items()
        }  # by the name in agents= (None: the agent's own)
        for child in self.children.values():
            self.transport.stubs.update(child.stubs)
            self.expect_incomplete |= child.expect_incomplete

    @property
    def gated(self) -> bool:
        """Whether a tool of the agent (of its toolsets, as listed, or of an agent its agent
        tools call) needs approval."""
        own = (*self.tools.values(), *self.listed.values())
        return any(t.requires_approval for t in own) or any(c.gated for c in self.children.values())

    def _check_handlers(self) -> None:
        missing = sorted(name for name, t in self.tools.items() if t.handler is None)
        if missing:
            raise ConfigurationError(
                f"tools {missing} of agent {self.agent.name!r} have no handler; an agent "
                "module's AGENT must carry its handlers"
            )

    def _made(
        self, t: Tool, validate: Any, steers: Mapping[str, Steer] | None = None
    ) -> dict[str, Any]:
        """TestLLM's arguments for `t`, made once (and checked) before the check; `steers`:
        a child module's own values, over the check's."""
        return example_arguments(
            t.input_schema,
            tool_name=t.name,
            validate=validate,
            steers={**self.steers, **(steers or {})},
            now=self.now,
        )

    def _made_own(self, t: Tool, steers: Mapping[str, Steer] | None = None) -> dict[str, Any]:
        """TestLLM's arguments for a tool of the agent's own (or a child's): checked
        against its model."""
        validate = t.input_model.model_validate if t.input_model else t.parse_arguments
        return self._made(t, validate, steers)

    def _check_given(self) -> None:
        known = set(self.tools) | set(self.listed)
        for option, names in (
            ("arguments", self.given),
            ("expect_incomplete", self.expect_incomplete),
        ):
            unknown = sorted(set(names) - known)
            if unknown:
                raise ConfigurationError(
                    f"{option}= names tools {self.agent.name!r} does not have: {unknown} "
                    f"(its tools: {sorted(known)})"
                )

    async def list_toolsets(self) -> None:
        """List every toolset once before the check: its tools' names, and TestLLM's
        arguments for them, made and checked now. `ConfigurationError` if one cannot list,
        or if `arguments=` names a tool nobody has."""
        if self.agent.toolsets:
            self.listed.update(
                await toolset_tools(
                    self.agent.name,
                    self.agent.toolsets,
                    self.tools,
                    stage=self.stage,
                    transport=self.transport,
                    make_deps=self.make_deps,
                    env=self.env,
                    settings=self.settings,
                )
            )
        self._check_given()
        for name, t in self.listed.items():
            if name not in self.arguments:
                self.arguments[name] = self._made(t, t.parse_arguments)

    def breach(
        self, scenario: Scenario, what: str, history: list[Message], *, blame: Blame = "kit"
    ) -> AssertionError:
        """The failure of `scenario`, saying whose rule broke (`_breach.breach`)."""
        return breach(
            self.agent.name, scenario, what, history, blame=blame, own_store=self.own_store
        )

    # -- playing ------------------------------------------------------------------

    async def play(self, scenario: Scenario, one_per_step: bool) -> list[Message]:
        """Play every turn on the scenario's session, crashing once, resuming until done."""
        self.stage.scenario = scenario
        crashing = RecordingStore(
            self.store, scenario.crash, scenario.appends, scenario.approval_writes,
            scenario.append_sessions,
        )  # fmt: skip
        for turn, text in enumerate(self.messages):
            scenario.turn = turn
            await self._play_turn(scenario, crashing, text, one_per_step)
        if scenario.crash is not None and not scenario.crashed:
            raise self.breach(
                scenario,
                "the crash point was never reached: it wrote less than without a crash. Does "
                "it behave differently from one run to the next (state kept between runs, the "
                "clock, randomness in a handler or in make_deps)? If not, the kit broke a rule "
                "here; please report this",
                await self.store.load_messages(scenario.name),
                blame="agent",
            )
        return await self.store.load_messages(scenario.name)

    async def _play_turn(
        self, scenario: Scenario, crashing: CrashingStore, text: str, one_per_step: bool
    ) -> None:
        """Run the turn of user message `text` until it completes: resumed after a crash or
        a `max_steps` stop, its waiting calls decided."""
        session_id = scenario.name
        for _ in range(_MAX_RUNS_PER_TURN):
            history = await self.store.load_messages(session_id)
            started = any(m.role == "user" and m.content == text for m in history)
            status, error = await self._run_once(
                scenario, crashing, None if started else text, one_per_step
            )
            if status == "crashed":
                await self._note_orphans(scenario)
            elif status == "complete":
                return
            elif status == "awaiting_approval":
                target: Store = self.store if scenario.crashed else crashing
                approvers = {None: self.approvers[None]} | {
                    session: self.approvers[child.name]
                    for session, child in (await self._child_sessions(scenario.name)).items()
                }
                decided = await decide_waiting(
                    self.store, target, scenario, self.decide, approvers, self.breach
                )
                if decided == "crashed":
                    await self._note_orphans(scenario)
            elif status != "max_steps":
                agents = status in _AGENT_STATUSES
                raise self.breach(
                    scenario,
                    f"run() ended with status {status!r} (error: {error}); with TestLLM "
                    "every turn should complete" + (_AGENT_STATUSES[status] if agents else ""),
                    await self.store.load_messages(session_id),
                    blame="agent" if agents else "kit",
                )
        raise self.breach(
            scenario,
            f"turn {scenario.turn + 1} did not complete in {_MAX_RUNS_PER_TURN} runs (each "
            f"ran up to max_steps={self.agent.max_steps} steps)",
            await self.store.load_messages(session_id),
        )

    async def _run_once(
        self, scenario: Scenario, crashing: CrashingStore, message: str | None, one_per_step: bool
    ) -> tuple[str, str | None]:
        scenario.runs += 1
        self.tally.runs += 1
        target: Store = self.store if scenario.crashed else crashing
        async with self.transport.client() as http:
            deps = self._deps(self.make_deps, self.env, http)
            children = {n: self._local(c, one_per_step, http) for n, c in self.children.items()}
            try:
                result = await run(
                    self.run_agent,
                    llm=TestLLM(one_per_step=one_per_step, arguments=self.arguments),
                    message=message,
                    session_id=scenario.name,
                    store=target,
                    tools=self.handlers,
                    deps=deps,
                    settings=self.settings,
                    http=http,
                    agents=children or None,
                )
            except SimulatedCrash:
                scenario.crashed = True
                return "crashed", None
            except Exception as exc:  # the check controls the call: the kit's to answer for
                raise self.breach(
                    scenario,
                    f"run() raised {type(exc).__name__}: {exc}",
                    await self.store.load_messages(scenario.name),
                ) from exc
        return result.status, result.error

    @staticmethod
    def _deps(make_deps: Any, env: Any, http: httpx.AsyncClient, child: str | None = None) -> Any:
        """`make_deps(env, http)` of the agent, or of the agent module `child` of `agents=`."""
        try:
            return make_deps(env, http)
        except Exception as exc:
            whose = "" if child is None else f" of agents[{child!r}]"
            raise AssertionError(
                f"your agent broke a rule: make_deps(env, http){whose} raised "
                f"{type(exc).__name__}: {exc}\n"
                f"env: {env!r}; pass the settings it needs as check_agent(..., env={{...}})"
            ) from exc

    def _local(self, child: ChildAgent, one_per_step: bool, http: httpx.AsyncClient) -> LocalAgent:
        """A child's `LocalAgent` for one run: an agent module's deps made now with the
        run's `http`, as the Worker makes them each turn."""
        deps = child.deps
        if child.make_deps is not None:
            deps = self._deps(child.make_deps, child.env, http, child.name)
        return child.local(one_per_step, deps)

    async def _child_sessions(self, session_id: str) -> dict[str, ChildAgent]:
        return await child_sessions(self.store, session_id, self.agent_tools, self.children)

    async def _note_orphans(self, scenario: Scenario) -> None:
        """The calls a crash left without a result and that may have run: a call waiting
        for a decision, or decided and not claimed yet, is no orphan (it never ran). The
        same in the child session of each call of an agent tool (the crash ended its turn
        too)."""
        sessions = [scenario, *map(scenario.child, await self._child_sessions(scenario.name))]
        for session in sessions:
            states = approval_states(await self.store.load_approvals(session.name))
            for call in pending_tool_calls(await self.store.load_messages(session.name)):
                state = states.get(call.id)
                if state is None or state.claimed:
                    session.orphaned[call.id] = call.name

    # -- checking -------------------------------------------------------------------

    async def check(self, scenario: Scenario, history: list[Message]) -> None:
        """Check a played scenario's stored history and what ran against every rule."""
        states = approval_states(await self.store.load_approvals(scenario.name))
        runs = ((i.tool_name, i.outcome, i.detail) for i in scenario.invocations)
        self.tally.count_tools(runs, scenario.decisions, history)
        try:
            assert_well_formed(history, self.messages)
            assert_approvals(scenario, history, states, self.rules, self.tally)
            assert_calls(scenario, history, self.rules, self.tally)
            assert_server_calls(
                scenario,
                history,
                states,
                self.rules,
                self.transport.servers,
                self.transport.server_tools,
                self.tally,
            )
            await assert_children(
                scenario, history, self.store, self.children, self.agent_tools, self.tally
            )
        except AgentBreach as exc:
            raise self.breach(scenario, str(exc), history, blame="agent") from None
        except AssertionError as exc:
            raise self.breach(scenario, str(exc), history) from None
