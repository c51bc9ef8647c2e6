"""Agent: the static part of a run (who it is, what it may call, its limits).

Its settings are described on `Agent` itself and in docs/python-api.md (Agents);
the limits in docs/limits.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from typing_extensions import TypeVar

from .context import DEFAULT_MAX_CONTEXT_TOKENS, HistoryProcessor, Summarizer
from .errors import ConfigurationError
from .limits import MAX_ROW_BYTES
from .messages import OUTPUT_TOOL
from .tools import DepsT, RunContext, Tool, Toolset

OutputT = TypeVar("OutputT", default=Any)
"""The type of a run's typed answer (`Agent(output_type=...)`, `RunResult.output`)."""

Instructions = Callable[[RunContext[Any]], str | Awaitable[str]]
"""Instructions made per turn: `instructions(ctx) -> str`, sync or async."""


# Not slots=True: on Python 3.11 a frozen slotted generic dataclass cannot be
# built through its alias (`Agent[Deps](...)` raises TypeError).
@dataclass(frozen=True)
class Agent(Generic[DepsT, OutputT]):
    """An agent definition, shared by every session that runs it.

    - `instructions`: the system message every LLM call starts with. A function
      of the turn's `RunContext` (deps, session, `now` from the injected clock;
      sync or async) makes it per turn: called once when the turn starts, its
      text is stored with the turn's first write, and a resumed turn is sent
      that text again, never a new one.
    - `tools`: what the LLM may call (handlers may be supplied per run).
    - `toolsets`: more tools, listed once per turn (`durable_agents.mcp.MCPTools`:
      an MCP server's). What the kit decided for each call of theirs is stored
      with the call (`ToolCall.policy`).
    - `output_type`: a typed answer (a pydantic model, a dataclass, a TypedDict, or
      any type pydantic validates). The model gives it by calling the tool
      `final_result` (its schema is the type's); an invalid answer goes back to
      the model with the validation errors, at most `max_output_retries` times a
      turn. The turn's final message stores the answer as JSON; `RunResult.output`
      holds it validated.
    - `max_tool_retries`: how many of one tool's calls in a turn may be answered
      `tool-retry` (its handler raised `ModelRetry`); past that, `tool-failed`.
    - `max_steps`: LLM calls one `run()` may make before it stops with
      status `"max_steps"` (the session stays resumable).
    - `max_result_bytes`: a tool result larger than this is stored as an
      error result instead, so a big result never makes the write that
      follows a side effect fail. At most the stores' row limit
      (`limits.MAX_ROW_BYTES`, 1,900,000 bytes, under D1's 2,000,000).
    - `max_message_bytes`: a user message larger than this is refused with
      `MessageTooLargeError` before anything is stored or sent.
    - `max_session_tokens`: a spend limit. Before each LLM call the session's
      stored usage (input + output tokens of every stored assistant message,
      so it survives crashes) is added up; at or over the limit the turn
      stops with status `"budget_exceeded"`, resumable once it is raised.
      None: no limit.
    - `tool_concurrency`: at most this many handlers of one step run at once
      (default 6: a Worker invocation may have 6 connections open at a time;
      the others wait their turn).
    - `max_tool_calls_per_step`: the calls of one LLM reply that are run
      (default 100); the rest are answered `too-many-calls` and never run
      (nor wait for approval), so the model can ask again in smaller steps.
    - `max_context_tokens`: what one LLM call may be sent (default 64,000),
      estimated at 4 bytes a token of the request as serialized for the
      provider (ids, type tags and escapes counted): a request's body stays
      within `4 * max_context_tokens` bytes, except while the running turn,
      sent whole, is too large by itself (with the instructions, tool specs
      and summary). Over it, older messages are folded into a stored summary
      before the call (`durable_agents.context`); the history itself keeps
      every message.
    - `summarize`: `summarize(previous_summary, messages) -> str` (sync or
      async) writes that summary; default: the run's own model, without tools.
    - `history_processor`: `process(messages) -> messages`, applied to what each
      LLM call is sent (instructions first); never stored.
    - `deps_type`: the type of the `deps` its runs take (`ctx.deps` in its
      handlers), for the type checker only: `Agent(..., deps_type=MyDeps)`
      is an `Agent[MyDeps]`, and `run(agent, deps=...)` must pass a `MyDeps`.
      Without it (or an annotation `Agent[MyDeps]`), deps are `Any`.
    """

    name: str
    instructions: str | Instructions = ""
    tools: Sequence[Tool] = field(default=())
    max_steps: int = 20
    max_result_bytes: int = 1_000_000
    max_message_bytes: int = 1_000_000
    deps_type: type[DepsT] | None = None
    max_session_tokens: int | None = None
    tool_concurrency: int = 6
    max_tool_calls_per_step: int = 100
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    summarize: Summarizer | None = None
    history_processor: HistoryProcessor | None = None
    toolsets: Sequence[Toolset] = field(default=())
    output_type: type[OutputT] | None = None
    max_tool_retries: int = 2
    max_output_retries: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "toolsets", tuple(self.toolsets))
        # (The checks run in this order: the first wrong setting is the one reported.)
        self._check_instructions_and_toolsets()
        self._check_counts()
        self._check_byte_limits()
        self._check_tools()

    def _check_instructions_and_toolsets(self) -> None:
        if not (isinstance(self.instructions, str) or callable(self.instructions)):
            raise ConfigurationError(
                f"agent {self.name!r}: instructions must be a str or a function of the "
                f"run's context, got {type(self.instructions).__name__}"
            )
        for toolset in self.toolsets:
            if not callable(getattr(toolset, "list_tools", None)):
                raise ConfigurationError(
                    f"agent {self.name!r}: toolsets must have list_tools(ctx) (e.g. "
                    f"durable_agents.mcp.MCPTools), got {toolset!r}"
                )

    def _check_counts(self) -> None:
        for count in ("max_tool_retries", "max_output_retries"):
            value = getattr(self, count)
            if type(value) is not int or value < 0:
                raise ConfigurationError(f"{count} must be an int >= 0, got {value!r}")
        if not self.name:
            raise ConfigurationError("an agent needs a name")
        if self.max_steps < 1:
            raise ConfigurationError(f"max_steps must be at least 1, got {self.max_steps}")
        for count in ("tool_concurrency", "max_tool_calls_per_step", "max_context_tokens"):
            value = getattr(self, count)
            if type(value) is not int or value < 1:
                raise ConfigurationError(f"{count} must be a positive int, got {value!r}")
        budget = self.max_session_tokens
        if budget is not None and (type(budget) is not int or budget < 1):
            raise ConfigurationError(f"max_session_tokens must be a positive int, got {budget!r}")

    def _check_byte_limits(self) -> None:
        for limit in ("max_result_bytes", "max_message_bytes"):
            value = getattr(self, limit)
            if not 0 < value <= MAX_ROW_BYTES:
                raise ConfigurationError(
                    f"{limit} must be between 1 and {MAX_ROW_BYTES:,} (the stores' row limit), "
                    f"got {value:,}"
                )

    def _check_tools(self) -> None:
        seen: set[str] = set()
        for t in self.tools:
            if not isinstance(t, Tool):
                hint = (
                    " (tool(name=..., description=...) without input= is a decorator; "
                    "declare a tool without arguments with input={})"
                    if callable(t)
                    else ""
                )
                raise ConfigurationError(
                    f"agent {self.name!r}: tools must be Tool objects (use @tool), got {t!r}{hint}"
                )
            if t.name in seen:
                raise ConfigurationError(f"agent {self.name!r} declares tool {t.name!r} twice")
            seen.add(t.name)
        if self.output_type is not None and OUTPUT_TOOL in seen:
            raise ConfigurationError(
                f"agent {self.name!r}: with output_type, the model answers through a tool "
                f"named {OUTPUT_TOOL!r}; rename the agent's own tool of that name"
            )

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings its toolsets read (`MCPTools(url_setting=...)`), in order."""
        names: list[str] = []
        for toolset in self.toolsets:
            names += [n for n in getattr(toolset, "settings", ()) if n not in names]
        return tuple(names)
