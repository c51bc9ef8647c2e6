"""A real agent process for the process-level tests: it gets killed, restarted and raced.

    python tests/support/process_agent.py --db PATH --effects PATH --session S
        [--mode turns|resume|send] [--message TEXT] [--turns N]
        [--start-file F] [--gate-dir D --gate-count N] [--think-ms MS] [--handler-ms MS]

Modes:
- `turns` (default): play turns 0..N-1 of the session. A turn whose user
  message is already stored is finished with `run(message=None)` (a no-op if
  it was complete); the next one is started with `run(message=turn_message(t))`.
  So a run killed anywhere is continued by the next one on the same files.
- `resume`: one `run(message=None)`.
- `send`: one `run(message=--message)`.

The agent has a `safe_to_retry` tool (`lookup`) and two side-effecting ones
(`post`, `charge`). The LLM is deterministic (`deterministic_llm()`, a
`FunctionLLM` playing `next_action`): each turn is three tool-call steps (one
with three parallel calls), then a final reply.
Every handler records its side effect in the effects file (see
`history_checks.append_effect`) between two short sleeps, which widen the
windows a kill can land in.

Protocol with the parent: the child prints `ready` once imported (before
touching the store), waits for `--start-file` if given, and ends by printing
one JSON line `{"outcome": "complete" | "conflict", ...}`; exit status 0 when
complete, 3 on `SessionConflictError`, 1 on anything else. With `--gate-dir`,
the first LLM call waits until `--gate-count` processes have reached theirs,
so all of them hold the same view of the session before any writes.

Importable too: the tests use `AGENT`, `deterministic_llm` and `make_handlers`
in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.history_checks import Turn, append_effect

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    SessionConflictError,
    ToolCall,
    ToolContext,
    ToolSpec,
    Usage,
    run,
    tool,
)
from durable_agents.stores import postgres_store, sqlite_store
from durable_agents.testing import FunctionLLM

_TEXT = {"properties": {"text": {"type": "string"}}, "required": ["text"]}
LOOKUP = tool(
    name="lookup", description="Look a ticket up (read only).", input=_TEXT, safe_to_retry=True
)
POST = tool(name="post", description="Post a message to the team channel.", input=_TEXT)
CHARGE = tool(name="charge", description="Charge the customer's card.", input=_TEXT)
AGENT = Agent("process-agent", "You handle support tickets.", [LOOKUP, POST, CHARGE], max_steps=10)
SAFE_TOOLS = frozenset({"lookup"})
UNSAFE_TOOLS = frozenset({"post", "charge"})

# The tool calls of each step of a turn; after the last step comes the final reply.
STEP_CALLS: tuple[tuple[str, ...], ...] = (("lookup",), ("post", "charge", "lookup"), ("post",))
TURNS = 3

CONFLICT_EXIT = 3


def turn_message(turn: int) -> str:
    return f"turn {turn}: please handle ticket T-{turn}"


def final_reply(turn: int) -> str:
    return f"done with turn {turn}"


def next_action(messages: list[Message], tools: Sequence[ToolSpec] = ()) -> LLMResponse:
    """The next action, decided from the history alone.

    The step is the number of assistant messages since the last user message:
    step k < len(STEP_CALLS) asks for STEP_CALLS[k] (with empty ids, for the
    loop to assign), the step after answers `final_reply(turn)`. Whatever a
    crash did to the results (a durability error, a re-invoked lookup), the
    plan goes on, so a finished history always has the same shape.
    """
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    turn = len(users) - 1
    step = sum(1 for m in messages[users[-1] :] if m.role == "assistant")
    usage = Usage(input_tokens=10 * len(messages), output_tokens=5)
    if step < len(STEP_CALLS):
        calls = [
            ToolCall("", name, {"text": f"t{turn} s{step} {name} {n}"})
            for n, name in enumerate(STEP_CALLS[step])
        ]
        return LLMResponse(text=f"step {step}", tool_calls=calls, usage=usage)
    return LLMResponse(text=final_reply(turn), usage=usage)


def deterministic_llm(
    think: float = 0.0, gate: Callable[[], Awaitable[None]] | None = None
) -> FunctionLLM:
    """`next_action` as an LLM. `think` seconds of sleep per call stand for the
    LLM's latency; `gate`, if given, is awaited once, on the first call."""
    gates = [gate] if gate is not None else []

    async def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if gates:
            await gates.pop()()
        if think:
            await asyncio.sleep(think)
        return next_action(messages, tools)

    return FunctionLLM(answer)


def assert_plays_script(turns: Sequence[Turn], first: int = 0) -> None:
    """Assert finished turns (from `history_checks.assert_well_formed`) are exactly
    what `deterministic_llm()` plays: its steps' tools in order, then its reply.
    `first` is the number of the first turn given (the replies name it)."""
    for number, turn in enumerate(turns, first):
        tools = tuple(tuple(c.name for c in step.calls) for step in turn.steps)
        assert tools == STEP_CALLS, f"turn {number} ran steps {tools}, not {STEP_CALLS}"
        assert turn.reply is not None, f"turn {number} has no final reply"
        assert turn.reply.content == final_reply(number), (
            f"turn {number} ends with {turn.reply.content!r}"
        )


def make_handlers(effects: str | os.PathLike[str], delay: float) -> dict[str, Any]:
    """Handlers for every tool: sleep, record the side effect, sleep `delay`, answer.

    The first sleep is `delay` times 1, 2, 3 for lookup, post, charge, so in
    the parallel step the effects land one by one, not all at once.
    """

    def make(
        name: str, before: float
    ) -> Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]:
        async def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            await asyncio.sleep(before)
            append_effect(effects, ctx.tool_name, ctx.tool_call_id, ctx.idempotency_key)
            await asyncio.sleep(delay)
            return {"tool": name, "text": args["text"], "resumed": ctx.resumed}

        return handler

    return {t.name: make(t.name, delay * n) for n, t in enumerate(AGENT.tools, 1)}


def file_gate(directory: Path, count: int, timeout: float = 30.0) -> Callable[[], Awaitable[None]]:
    """A barrier across processes: arrive by creating a file, wait for `count` of them."""

    async def wait() -> None:
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(directory / str(os.getpid()), os.O_CREAT | os.O_WRONLY, 0o644))
        deadline = time.monotonic() + timeout
        while len(os.listdir(directory)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {directory}: fewer than {count} arrived")
            await asyncio.sleep(0.001)

    return wait


async def play_turns(
    store: Any, session: str, llm: FunctionLLM, handlers: dict[str, Any], turns: int
) -> Any:
    """Finish the stored turn if needed, then play the remaining ones up to `turns`."""
    stored_users = sum(1 for m in await store.load_messages(session) if m.role == "user")
    result = None
    for t in range(turns):
        if t < stored_users - 1:
            continue  # a later turn started, so this one finished
        message = None if t == stored_users - 1 else turn_message(t)
        result = await run(
            AGENT, llm=llm, message=message, session_id=session, store=store, tools=handlers
        )
        if result.status != "complete":
            return result
    return result


async def main(args: argparse.Namespace) -> int:
    gate = file_gate(Path(args.gate_dir), args.gate_count) if args.gate_dir else None
    llm = deterministic_llm(think=args.think_ms / 1000, gate=gate)
    handlers = make_handlers(args.effects, args.handler_ms / 1000)
    outcome: dict[str, Any] = {"pid": os.getpid(), "session": args.session, "mode": args.mode}
    outcome["message"] = args.message
    at_url = args.db.startswith("postgresql://")  # a PostgreSQL database: tests/test_worker.py
    async with postgres_store(args.db) if at_url else sqlite_store(args.db) as store:
        try:
            if args.mode == "turns":
                result = await play_turns(store, args.session, llm, handlers, args.turns)
            else:
                message = args.message if args.mode == "send" else None
                result = await run(
                    AGENT,
                    llm=llm,
                    message=message,
                    session_id=args.session,
                    store=store,
                    tools=handlers,
                    lease_seconds=None if args.no_lease else 30.0,
                )
        except SessionConflictError as exc:
            outcome.update(outcome="conflict", llm_calls=llm.calls, error=str(exc))
            print(json.dumps(outcome), flush=True)
            return CONFLICT_EXIT
    outcome.update(
        outcome="complete" if result.status == "complete" else result.status,
        status=result.status,
        response=result.response,
        steps=result.steps,
        llm_calls=llm.calls,
        error=result.error,
    )
    print(json.dumps(outcome), flush=True)
    return 0 if result.status == "complete" else 1


# -- for the parent: start children, read their state ------------------------------

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[2]  # for `tests.support`, which the child imports
SRC = ROOT / "src"


def spawn(
    db: Path | str, effects: Path, session: str, *options: str, script: Path = SCRIPT
) -> subprocess.Popen[bytes]:
    """Start a child on `db` and `effects` (unbuffered stdout: `read_line` never
    reads past a line): this module, or another `script` that takes the same
    `--db`, `--effects` and `--session`. Prefer `child()`, which cleans up."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(script), "--db", str(db), "--effects", str(effects)]
    command += ["--session", session, *options]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0
    )


@contextmanager
def child(
    db: Path | str, effects: Path, session: str, *options: str, script: Path = SCRIPT
) -> Iterator[subprocess.Popen[bytes]]:
    """`spawn()` a child; on leaving, kill it if it still runs, wait for it and close
    its pipes, so no child outlives a failing test."""
    proc = spawn(db, effects, session, *options, script=script)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The child's next stdout line ("" at EOF); raises TimeoutError after `timeout` s."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"child {proc.pid} printed nothing for {timeout} s")
    return proc.stdout.readline().decode()


def wait_ready(proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Wait for the child's `ready` line: it, or the child's exit, ends the wait (the cap is
    for a loaded machine, where starting Python and importing the kit takes seconds)."""
    line = read_line(proc, timeout)
    if line != "ready\n":
        _, err = proc.communicate(timeout=timeout)
        raise AssertionError(f"child {proc.pid} did not start: {line!r}\n{err.decode()}")


def reap(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> tuple[int, str, str]:
    """Wait for the child (killing it if it outlives `timeout`): (exit code, stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out.decode(), err.decode()


def outcome_of(stdout: str) -> dict[str, Any] | None:
    """The JSON outcome line a child printed last, if any."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            outcome: dict[str, Any] = json.loads(line)
            return outcome
    return None


def load_history(db: Path, session: str) -> list[Message]:
    """The stored history, read through the store as a fresh process would."""

    async def load() -> list[Message]:
        async with sqlite_store(db) as store:
            return await store.load_messages(session)

    return asyncio.run(load())


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--mode", choices=["turns", "resume", "send"], default="turns")
    parser.add_argument("--message")
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--start-file")
    parser.add_argument("--gate-dir")
    parser.add_argument("--gate-count", type=int, default=1)
    parser.add_argument("--think-ms", type=float, default=5.0)
    parser.add_argument("--handler-ms", type=float, default=4.0)
    parser.add_argument(
        "--no-lease", action="store_true", help="run(lease_seconds=None): race unguarded"
    )
    args = parser.parse_args(argv)
    if (args.mode == "send") != (args.message is not None):
        parser.error("--message goes with --mode send, and only with it")
    return args


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    print("ready", flush=True)
    if arguments.start_file:
        start_deadline = time.monotonic() + 30
        while not os.path.exists(arguments.start_file):
            if time.monotonic() > start_deadline:
                sys.exit("the start file never appeared")
            time.sleep(0.0005)
    sys.exit(asyncio.run(main(arguments)))
