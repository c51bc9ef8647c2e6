"""On CPython: a process that finishes crashed turns and fires due schedules.

    durable-agents worker --db agent.db --app myapp:runner [--poll 1] [--once]

or, from Python, over any store with `expired_leases` and `due_schedules` (the
SQLite store):

    runner = Runner(AGENT, llm=AnthropicLLM(...), tools=HANDLERS)
    report = await work_once(runner, store)     # one pass
    await serve(runner, store, poll=1.0)        # passes until `stop` is set

A `Runner` names what the application's own `run()` calls pass (the agent, its
LLM, handlers and deps). Each pass does two things:

- Resume. A run lease left behind (expired, or held by a process of this host
  that is gone) is a turn whose process died: the worker finishes it with
  `run(message=None, origin="self-resumed")`, which repairs the lost calls as any
  resume does. A turn whose resumes keep crashing is not resumed forever: the
  worker counts them in the lease itself (below) and, after `max_resumes` of
  them, ends the turn with `stop_turn` (a note saying why; the session's state
  becomes "stopped"). Between two resumes of one turn it waits `backoff_seconds`,
  doubling each time.
- Fire. Every due schedule runs as a turn, `run(message=schedule.message,
  request_key=schedule.request_key, origin="scheduled")`: its first write stores
  the message and removes the schedule in one transaction, which fails if the
  schedule was cancelled or fired already. So a schedule runs once, however many
  workers race for it and wherever one dies (a firing that dies after that write
  is a turn like any other, resumed as above).

Two workers (or a worker and the application's own runs) can share a store: a
session another run holds is skipped (`wait_seconds=0`), never waited for, and
each write is conditional. Errors are per item: one broken session is reported
(`WorkReport`) and the pass goes on with the next.

How resumes are counted, with no table of their own: the worker takes a
session's lease before it runs anything there, under an owner that says how
many times in a row the worker has tried the session and when this try began
(`host/pid/worker.<n>.<unix ms>.<id>`). The run keeps that owner and releases
the lease with its last write, so a lease left behind by a worker names the
attempt that died; the next pass reads it and tries again as attempt n + 1. A
turn that finishes releases the lease: the count is gone with it. A firing that
dies before its first write is counted the same way (the schedule is still
there): after `max_resumes` such deaths the schedule is no longer fired, and
each pass reports it until someone cancels it (`store.delete_schedule`).

The worker runs one item at a time: a long turn delays the others (start a
second worker to work beside it). A resume that fails without a crash (it
raises, or its LLM call fails: status "error") is reported and not retried:
`run()` released the lease, and the turn waits, interrupted, for a person
(`run(message=None)` or `stop_turn`). Like any run, the worker takes a lease
over once it expires: a run that goes `lease_seconds` without a write (a very
slow LLM call) may find its turn resumed beside it, which costs a duplicate LLM
call, never a duplicate side effect (every write is conditional).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import re
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol

from ._turn.leases import died_on_this_host, lease_owner
from .agent import Agent
from .agent_tools import AgentRunner, LocalAgent
from .approvals import pending_approvals
from .errors import (
    ApprovalPendingError,
    ConfigurationError,
    SessionBusyError,
    SessionConflictError,
    SessionNotFoundError,
    describe_exception,
)
from .llm.base import LLM
from .run import RunStatus, run, stop_reason, stop_turn
from .stores.base import LeaseHolder, Schedule, Store
from .tools import DepsT, Handler

_log = logging.getLogger("durable_agents.worker")

# The run id of a worker's lease: worker.<attempt>.<unix ms the attempt began>.<id>
_ATTEMPT = re.compile(r"worker\.(\d{1,9})\.(\d{1,16})\.")


class WorkStore(Store, Protocol):
    """A store the worker can scan: the `Store` protocol, plus finding the sessions
    with work across the store (`SQLiteStore` has both)."""

    async def expired_leases(
        self, *, limit: int = 100, host: str | None = None
    ) -> list[tuple[str, LeaseHolder]]: ...

    async def due_schedules(
        self, before_ms: int, *, limit: int = 100
    ) -> list[tuple[str, Schedule]]: ...


@dataclass(frozen=True, slots=True)
class Runner(Generic[DepsT]):
    """What the worker passes to `run()`: what the application's own calls pass.

    `agents` are what its agent's agent tools call, as `run(agents=)` takes them.
    `clock` (seconds, default `time.time` read at call time) tells the worker when
    schedules are due and dates what handlers schedule; `new_id` makes tool call
    ids and the worker's lease ids (default: random UUIDs). `lease_seconds` as for
    `run()`."""

    agent: Agent[DepsT]
    llm: LLM
    deps: DepsT | None = None
    tools: Mapping[str, Handler] | None = None
    lease_seconds: float = 30.0
    clock: Callable[[], float] | None = None
    new_id: Callable[[], str] | None = None
    agents: AgentRunner | Mapping[str, Agent[Any, Any] | LocalAgent] | None = None


Action = Literal["resume", "fire"]
Outcome = Literal[
    "resumed", "fired", "stopped", "cleared", "busy", "gone", "waiting", "skipped", "error"
]
# Outcomes that say nothing happened because someone else acted (or will): logged quietly.
_QUIET: frozenset[str] = frozenset({"busy", "gone", "waiting", "skipped"})


@dataclass(frozen=True, slots=True)
class WorkItem:
    """What a pass did about one leftover lease (`resume`) or due schedule (`fire`).

    `outcome`:
    - "resumed" / "fired": a turn ran; `status` is its `RunResult.status` (and
      `detail` its error, if any).
    - "stopped": the turn's resumes kept crashing; `stop_turn` ended it.
    - "cleared": a lease left by a run that died before storing anything (or
      after its turn ended): nothing to resume, the lease was released.
    - "busy": another live run holds the session; it is left to that run.
    - "gone": the schedule was cancelled or fired by another run meanwhile.
    - "waiting": not now: backing off after a crash, calls waiting for a person's
      approval, or an interrupted turn of the session comes first (`detail`).
    - "skipped": the session belongs to another agent than the runner's.
    - "error": something failed (`detail`); the next item was worked on anyway.
    """

    action: Action
    session_id: str
    outcome: Outcome
    detail: str = ""
    schedule_id: str | None = None
    status: RunStatus | None = None

    def describe(self) -> str:
        what = f"schedule {self.schedule_id} of session" if self.action == "fire" else "session"
        text = f"{self.action} {what} {self.session_id}: {self.outcome}"
        if self.status is not None:
            text += f" ({self.status})"
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True, slots=True)
class WorkReport:
    """One pass of the worker. `more`: a listing was cut at `limit`, so more work
    may be waiting (`serve` starts the next pass at once)."""

    items: list[WorkItem] = field(default_factory=list)
    more: bool = False

    @property
    def errors(self) -> list[WorkItem]:
        return [i for i in self.items if i.outcome == "error"]

    def count(self, outcome: Outcome) -> int:
        return sum(1 for i in self.items if i.outcome == outcome)


async def work_once(
    runner: Runner[Any],
    store: WorkStore,
    *,
    limit: int = 100,
    max_resumes: int = 3,
    backoff_seconds: float = 10.0,
) -> WorkReport:
    """One pass: resume the turns whose process died, then fire the due schedules.

    Up to `limit` of each. A turn is resumed at most `max_resumes` times in a row
    by workers; the next pass ends it with `stop_turn`. After the n-th resume (or
    firing) of a session died, the next waits until `backoff_seconds * 2**(n-1)`
    after that one began. Raises only if the store cannot be listed; a failure on
    one session is its `WorkItem`."""
    if limit < 1 or max_resumes < 1 or not backoff_seconds >= 0:
        raise ConfigurationError("limit and max_resumes must be >= 1, backoff_seconds >= 0")
    work = _Pass(runner, store, max_resumes, backoff_seconds)
    now_ms = work.now_ms()
    leases = await store.expired_leases(limit=limit, host=socket.gethostname())
    due = await store.due_schedules(now_ms + 1, limit=limit)  # due at or before now
    due_sessions = {session_id for session_id, _ in due}
    items: list[WorkItem] = []
    left: dict[str, LeaseHolder] = {}  # leases left for their session's schedule to count
    held: set[str] = set()  # sessions whose schedules wait: a turn (or schedule) comes first
    for session_id, holder in leases:
        if not _left_behind(holder, now_ms):
            continue  # a live run of this host: not ours to touch
        item = await work.resume(session_id, holder, session_id in due_sessions)
        if item is None:
            left[session_id] = holder
            continue
        items.append(item)
        if item.outcome in ("busy", "waiting", "skipped", "error"):
            held.add(session_id)
    for session_id, schedule in due:
        if session_id in held:
            why = "its interrupted turn is finished first"
            items.append(WorkItem("fire", session_id, "waiting", why, schedule.schedule_id))
            continue
        item = await work.fire(session_id, schedule, left.pop(session_id, None))
        items.append(item)
        if item.outcome != "fired":
            held.add(session_id)  # its later schedules wait for the next pass
    return WorkReport(items, more=len(leases) >= limit or len(due) >= limit)


async def serve(
    runner: Runner[Any],
    store: WorkStore,
    *,
    poll: float = 1.0,
    stop: asyncio.Event | None = None,
    on_report: Callable[[WorkReport], None] | None = None,
    limit: int = 100,
    max_resumes: int = 3,
    backoff_seconds: float = 10.0,
) -> None:
    """`work_once` every `poll` seconds until `stop` is set (at once again after a
    pass that did work and was cut at `limit`). Each report goes to `on_report`
    (default: logged to the `durable_agents.worker` logger). A pass that fails
    outright (the store cannot be read) is logged; the next one tries again."""
    if not poll > 0:
        raise ConfigurationError("poll must be > 0 seconds")
    stop = stop or asyncio.Event()
    report_to = on_report or log_report
    while not stop.is_set():
        report = None
        try:
            report = await work_once(
                runner, store, limit=limit, max_resumes=max_resumes,
                backoff_seconds=backoff_seconds,
            )  # fmt: skip
        except Exception:
            _log.exception("a pass failed; the next one tries again in %s s", poll)
        if report is not None:
            report_to(report)
            done = sum(report.count(o) for o in ("resumed", "fired", "stopped", "cleared"))
            if report.more and done:
                continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll)


def log_report(report: WorkReport) -> None:
    """Log each item: errors as errors, what was done as info, the rest as debug."""
    for item in report.items:
        if item.outcome == "error":
            _log.error("%s", item.describe())
        else:
            level = logging.DEBUG if item.outcome in _QUIET else logging.INFO
            _log.log(level, "%s", item.describe())


def load_runner(spec: str) -> Runner[Any]:
    """The `Runner` that `MODULE:ATTR` names (ATTR may be dotted): a `Runner`, or a
    function of no arguments that returns one (called once). `ConfigurationError`
    if there is none."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"--app takes MODULE:ATTR (such as myapp:runner), got {spec!r}")
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name != missing and not module_name.startswith(missing + "."):
            raise  # the module is there, and something it imports is not
        raise ConfigurationError(f"no module {module_name!r} (from --app {spec})") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigurationError(f"module {module_name!r} has no {attribute!r} (--app {spec})")
        found = getattr(found, part)
    if not isinstance(found, Runner) and callable(found):
        found = found()
    if not isinstance(found, Runner):
        raise ConfigurationError(
            f"--app {spec} names {type(found).__name__}, not a Runner (or a function of no "
            "arguments returning one)"
        )
    return found


# -- one pass -------------------------------------------------------------------------------


def _left_behind(holder: LeaseHolder, now_ms: int) -> bool:
    """Whether the lease's run is gone: it expired, or its process (of this host) ended.
    (The store lists this host's unexpired leases too; the clocks may differ a little,
    which the conditional take of the lease settles.)"""
    return holder.expires_at <= now_ms or died_on_this_host(holder)


def _attempts(owner: str) -> tuple[int, int]:
    """(how many worker tries in a row the lease's owner was, when it began in Unix ms);
    (0, 0) for the lease of a run that is not a worker's."""
    run_id = owner.split("/", 2)[-1]
    found = _ATTEMPT.match(run_id)
    return (int(found[1]), int(found[2])) if found else (0, 0)


class _Pass:
    """One pass's view of the runner, the store and the limits."""

    def __init__(
        self, runner: Runner[Any], store: WorkStore, max_resumes: int, backoff_seconds: float
    ) -> None:
        self.runner = runner
        self.store = store
        self.max_resumes = max_resumes
        self.backoff_ms = backoff_seconds * 1000
        self.clock = runner.clock or time.time
        self.new_id = runner.new_id or (lambda: uuid.uuid4().hex)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def resume(
        self, session_id: str, holder: LeaseHolder, has_due_schedule: bool
    ) -> WorkItem | None:
        """Finish the turn whose run left `holder` behind (or stop it, or clear the lease).
        None: the session has no unfinished turn but a due schedule, whose firing is
        what died; the lease is left for `fire` to count it."""
        attempts, began_ms = _attempts(holder.owner)

        def item(outcome: Outcome, detail: str = "", status: RunStatus | None = None) -> WorkItem:
            return WorkItem("resume", session_id, outcome, detail, status=status)

        try:
            other = await self.other_agent(session_id)
            if other is not None:
                return item("skipped", other)
            _, history = await self.store.load_context(session_id)
            if not history or history[-1].is_final_reply:
                if history and has_due_schedule:
                    return None
                await self.store.release_lease(session_id, holder.owner)
                return item("cleared", "a run died before storing its turn; nothing to resume")
            if attempts >= self.max_resumes:
                return await self.stop(session_id, attempts)
            wait = self.backoff(attempts, began_ms)
            if wait:
                return item("waiting", wait)
            owner = await self.claim(session_id, attempts + 1, holder.owner)
            if owner is None:
                return item("busy", "another run took the session over")
            try:
                # Under the lease: another worker may have finished the turn between the
                # look above and this claim (its lease released, so the claim found none).
                _, history = await self.store.load_context(session_id)
                if history and history[-1].is_final_reply:
                    return item("cleared", "another run finished the turn meanwhile")
                result = await run(
                    self.runner.agent, llm=self.runner.llm, message=None, session_id=session_id,
                    store=self.store, tools=self.runner.tools, deps=self.runner.deps,
                    new_id=self.runner.new_id, lease_seconds=self.runner.lease_seconds,
                    wait_seconds=0, origin="self-resumed", clock=self.runner.clock,
                    agents=self.runner.agents,
                    _lease_run_id=owner.split("/", 2)[-1],
                )  # fmt: skip
            finally:
                await self.release(session_id, owner)
            return item("resumed", result.error or "", result.status)
        except SessionBusyError:
            return item("busy", "another run holds the session")
        except (SessionConflictError, SessionNotFoundError) as exc:
            return item("gone", f"the session changed meanwhile ({exc})")
        except Exception as exc:
            _log.debug("resume of %s failed", session_id, exc_info=True)
            return item("error", describe_exception(exc))

    async def stop(self, session_id: str, attempts: int) -> WorkItem:
        result = await stop_turn(
            self.runner.agent, store=self.store, session_id=session_id,
            reason=stop_reason(attempts),
            lease_seconds=self.runner.lease_seconds, wait_seconds=0,
        )  # fmt: skip
        if result.error_code != "turn-stopped":  # another run finished it meanwhile
            return WorkItem("resume", session_id, "cleared", "the turn had ended meanwhile")
        detail = f"its resumes crashed {attempts} times in a row"
        return WorkItem("resume", session_id, "stopped", detail, status=result.status)

    async def fire(self, session_id: str, schedule: Schedule, left: LeaseHolder | None) -> WorkItem:
        """Run the schedule's turn. `left`: the lease its last firing left, dying."""
        attempts, began_ms = _attempts(left.owner) if left is not None else (0, 0)

        def item(outcome: Outcome, detail: str = "", status: RunStatus | None = None) -> WorkItem:
            return WorkItem("fire", session_id, outcome, detail, schedule.schedule_id, status)

        try:
            other = await self.other_agent(session_id)
            if other is not None:
                return item("skipped", other)
            if await pending_approvals(self.store, session_id):
                return item("waiting", "calls of the session wait for approval")
            if attempts >= self.max_resumes:
                return item(
                    "error",
                    f"not fired: the session's scheduled turn crashed the worker {attempts} "
                    "times in a row before storing anything; cancel the schedule at fault "
                    "(store.delete_schedule) or run it by hand",
                )
            wait = self.backoff(attempts, began_ms)
            if wait:
                return item("waiting", wait)
            owner = await self.claim(session_id, attempts + 1, left.owner if left else None)
            if owner is None:
                return item("busy", "another run holds the session")
            try:
                # Under the lease: a firing that ended meanwhile removed it; so does a cancel.
                if schedule not in await self.store.load_schedules(session_id):
                    return item("gone", "cancelled, or fired by another run")
                result = await run(
                    self.runner.agent, llm=self.runner.llm, message=schedule.message,
                    session_id=session_id, store=self.store, tools=self.runner.tools,
                    deps=self.runner.deps, new_id=self.runner.new_id,
                    request_key=schedule.request_key, lease_seconds=self.runner.lease_seconds,
                    wait_seconds=0, origin="scheduled", clock=self.runner.clock,
                    agents=self.runner.agents,
                    _lease_run_id=owner.split("/", 2)[-1],
                )  # fmt: skip
            finally:
                await self.release(session_id, owner)
            return item("fired", result.error or "", result.status)
        except SessionBusyError:
            return item("busy", "another run holds the session")
        except SessionConflictError:
            return item("gone", "cancelled, or fired by another run")
        except ApprovalPendingError:
            return item("waiting", "calls of the session wait for approval")
        except Exception as exc:
            _log.debug("firing %s of %s failed", schedule.schedule_id, session_id, exc_info=True)
            return item("error", describe_exception(exc))

    async def other_agent(self, session_id: str) -> str | None:
        """Why the session is not the runner's to run, if it is not."""
        info = await self.store.get_session(session_id)
        mine = self.runner.agent.name
        if info is None or info.agent_name in (None, mine):
            return None
        return f"a session of agent {info.agent_name!r}; this worker runs {mine!r}"

    def backoff(self, attempts: int, began_ms: int) -> str:
        """Why not to try again yet, if the last try began too recently."""
        if attempts == 0:
            return ""
        ready_ms = began_ms + math.ceil(self.backoff_ms * 2 ** (attempts - 1))
        left_ms = ready_ms - self.now_ms()
        if left_ms <= 0:
            return ""
        return f"try {attempts} crashed; try {attempts + 1} in {left_ms / 1000:.1f} s"

    async def claim(self, session_id: str, attempt: int, take_from: str | None) -> str | None:
        """Take the session's lease as try `attempt` (from `take_from`, the run that died,
        only: never from one that took it over since); the owner, or None if another
        run holds it."""
        owner = lease_owner(f"worker.{attempt}.{self.now_ms()}.{self.new_id()}")
        ttl_ms = math.ceil(self.runner.lease_seconds * 1000)
        holder = await self.store.acquire_lease(session_id, owner, ttl_ms, take_from=take_from)
        return owner if holder is None else None

    async def release(self, session_id: str, owner: str) -> None:
        """Give the lease up if the run did not (it ended early, or raised)."""
        with contextlib.suppress(Exception):
            await self.store.release_lease(session_id, owner)
