"""The run lease: runs of one session take turns instead of repairing each other's live calls.

What must hold: a second run waits (bounded, then `SessionBusyError` with
nothing written and no LLM call); taking the lease is the turn's one extra
write and the turn's last append releases it; a lease left by a dead run is
taken over at expiry, or at once when its process ran on this host; write #1
holds it through the step's tool timeouts; `lease_seconds=None` takes none.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    SessionBusyError,
    ToolCall,
    ToolDurabilityError,
    run,
    tool,
)
from durable_agents.stores import LeaseHolder, Store, sqlite_store
from durable_agents.testing import CrashingStore, ScriptedLLM, SimulatedCrash, crash_on_write

HOUR_MS = 3_600_000


class LeaseCounting(CrashingStore):
    """Counts lease takes and releases beside the appends."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, None)
        self.takes = 0
        self.releases = 0

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        self.takes += 1
        return await self.inner.acquire_lease(session_id, owner, ttl_ms, take_from=take_from)

    async def release_lease(self, session_id: str, owner: str) -> None:
        self.releases += 1
        await self.inner.release_lease(session_id, owner)


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    async with sqlite_store(tmp_path / "agents.db") as s:
        yield s


def post_agent(
    posts: list[str], *, delay: float = 0.0, started: asyncio.Event | None = None
) -> Agent:
    @tool
    async def post(args: dict[str, Any]) -> str:
        """Posts a message."""
        posts.append(args["text"])
        if started is not None:
            started.set()
        await asyncio.sleep(delay)
        return "posted"

    return Agent("poster", "Post what you are told.", [post])


def post_then_reply(text: str) -> ScriptedLLM:
    return ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("", "post", {"text": text})]),
            LLMResponse(text=f"posted {text}"),
        ]
    )


async def test_a_turn_takes_the_lease_once_and_its_last_write_releases_it(store: Store) -> None:
    counting = LeaseCounting(store)
    result = await run(
        post_agent([]), llm=post_then_reply("a"), message="go", session_id="s", store=counting
    )
    assert result.status == "complete"
    assert (counting.takes, counting.appends, counting.releases) == (1, 3, 0)
    # Released by the final write itself: another owner takes it at once.
    assert await store.acquire_lease("s", "someone-else", HOUR_MS) is None


async def test_a_second_run_waits_for_the_first_instead_of_repairing_its_call(
    store: Store,
) -> None:
    posts: list[str] = []
    in_flight = asyncio.Event()
    agent = post_agent(posts, delay=0.3, started=in_flight)
    first = asyncio.create_task(
        run(agent, llm=post_then_reply("one"), message="first", session_id="s", store=store)
    )
    await in_flight.wait()
    second = await run(
        agent, llm=post_then_reply("two"), message="second", session_id="s", store=store
    )
    assert (await first).status == second.status == "complete"
    assert posts == ["one", "two"]
    history = await store.load_messages("s")
    assert not any(ToolDurabilityError.from_message(m) for m in history)
    assert [m.content for m in history if m.role == "user"] == ["first", "second"]


async def test_a_run_that_cannot_get_the_lease_in_time_is_busy_and_writes_nothing(
    store: Store,
) -> None:
    assert await store.acquire_lease("s", "elsewhere/1/live-run", HOUR_MS) is None
    llm = ScriptedLLM([])
    with pytest.raises(SessionBusyError) as caught:
        await run(
            post_agent([]), llm=llm, message="go", session_id="s", store=store, wait_seconds=0.05
        )
    assert caught.value.code == "session-busy"
    assert caught.value.owner == "elsewhere/1/live-run"
    assert "busy" in str(caught.value)
    assert llm.calls == []
    assert await store.load_messages("s") == []


async def test_an_expired_lease_of_a_dead_run_is_taken_and_its_call_repaired(
    tmp_path: Path,
) -> None:
    now = [1_800_000_000.0]
    async with sqlite_store(tmp_path / "a.db", clock=lambda: now[0]) as store:
        posts: list[str] = []
        agent = post_agent(posts)
        # A run on another host stored its call, then died holding the lease.
        call = ToolCall("c1", "post", {"text": "lost"})
        await store.append_messages_atomic(
            "s", 0, [Message.user("go"), Message.assistant("", [call])]
        )
        assert await store.acquire_lease("s", "otherhost/77/dead-run", 1_000) is None
        with pytest.raises(SessionBusyError):
            await run(agent, llm=ScriptedLLM([]), session_id="s", store=store, wait_seconds=0.02)
        now[0] += 1.0  # the lease expires
        result = await run(
            agent, llm=ScriptedLLM([LLMResponse(text="checked")]), session_id="s", store=store
        )
        assert result.status == "complete"
        assert posts == []
        assert ToolDurabilityError.from_message((await store.load_messages("s"))[2])


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_a_lease_of_a_dead_process_on_this_host_is_taken_at_once(store: Store) -> None:
    owner = f"{socket.gethostname()}/{dead_pid()}/killed-run"
    assert await store.acquire_lease("s", owner, HOUR_MS) is None
    result = await run(
        post_agent([]), llm=post_then_reply("x"), message="go", session_id="s", store=store,
        wait_seconds=0.0,
    )  # fmt: skip
    assert result.status == "complete"


async def test_a_lease_of_a_live_process_on_this_host_is_waited_for(store: Store) -> None:
    owner = f"{socket.gethostname()}/{os.getppid()}/live-run"
    assert await store.acquire_lease("s", owner, HOUR_MS) is None
    with pytest.raises(SessionBusyError):
        await run(
            post_agent([]), llm=ScriptedLLM([]), message="go", session_id="s", store=store,
            wait_seconds=0.02,
        )  # fmt: skip


async def test_write_one_holds_the_lease_through_the_tools_timeouts(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    async with sqlite_store(tmp_path / "a.db", clock=lambda: now[0]) as store:
        seen: list[LeaseHolder | None] = []

        @tool(timeout=600)
        async def post(args: dict[str, Any]) -> str:
            """Posts slowly."""
            now[0] += 60  # past lease_seconds, within the tool's timeout
            seen.append(await store.acquire_lease("s", "other/1/x", HOUR_MS))
            return "ok"

        result = await run(
            Agent("a", tools=[post]), llm=post_then_reply("x"), message="go", session_id="s",
            store=store, lease_seconds=30,
        )  # fmt: skip
        assert result.status == "complete"
        (holder,) = seen
        assert holder is not None, "the lease lapsed while the handler ran within its timeout"
        assert holder.expires_at >= int((now[0] - 60 + 600) * 1000)


@pytest.mark.parametrize(
    "failure",
    ["llm-error-first-call", "llm-error-later", "crash", "max-steps"],
)
async def test_every_ending_leaves_the_lease_free(store: Store, failure: str) -> None:
    agent = post_agent([])
    call = LLMResponse(tool_calls=[ToolCall("", "post", {"text": "x"})])
    target: Store = store
    if failure == "llm-error-first-call":
        llm = ScriptedLLM([RuntimeError("down")])  # type: ignore[list-item]
    elif failure == "llm-error-later":
        llm = ScriptedLLM([call, RuntimeError("down")])  # type: ignore[list-item]
    elif failure == "crash":  # SimulatedCrash unwinds in-process: the lease is released
        llm, target = post_then_reply("x"), crash_on_write(store, 2)
    else:
        agent = Agent("poster", "", agent.tools, max_steps=1)
        llm = ScriptedLLM([call])
    try:
        result = await run(agent, llm=llm, message="go", session_id="s", store=target)
        assert result.status in ("error", "max_steps")
    except SimulatedCrash:
        assert failure == "crash"
    assert await store.acquire_lease("s", "next-run", HOUR_MS) is None


async def test_max_steps_releases_in_its_last_write(store: Store) -> None:
    counting = LeaseCounting(store)
    agent = Agent("poster", "", post_agent([]).tools, max_steps=1)
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("", "post", {"text": "x"})])])
    result = await run(agent, llm=llm, message="go", session_id="s", store=counting)
    assert result.status == "max_steps"
    assert (counting.takes, counting.appends, counting.releases) == (1, 2, 0)


async def test_reading_a_finished_turn_takes_no_lease(store: Store) -> None:
    await run(post_agent([]), llm=post_then_reply("x"), message="go", session_id="s", store=store)
    counting = LeaseCounting(store)
    assert await store.acquire_lease("s", "elsewhere/1/busy", HOUR_MS) is None
    result = await run(post_agent([]), llm=ScriptedLLM([]), session_id="s", store=counting)
    assert (result.status, result.response) == ("complete", "posted x")
    assert counting.takes == 0


async def test_no_lease_when_the_caller_serializes_runs_itself(store: Store) -> None:
    counting = LeaseCounting(store)
    await run(
        post_agent([]), llm=post_then_reply("x"), message="go", session_id="s", store=counting,
        lease_seconds=None,
    )  # fmt: skip
    assert (counting.takes, counting.releases, counting.appends) == (0, 0, 3)
