"""Tools: what the LLM may call, how its arguments are checked, and how results are encoded.

Ways to make one (the guide: docs/python-api.md, "Tools"):

    @tool(safe_to_retry=True)  # plain parameters: the schema built from the signature
    async def get_issue(ctx: ToolContext, repo: str, number: int) -> Issue:
        '''Fetch an issue.'''

    @tool  # one pydantic model: that model's schema
    async def post_slack(args: SlackPost, ctx: ToolContext) -> Receipt:
        '''Post to Slack.'''

    notify = tool(name="notify", description="Notify someone", input=Notice)
    # handler supplied later: run(agent, ..., tools={"notify": handler})

`safe_to_retry` is a statement about the operation, not a retry policy: it
lets the run loop call the handler again when a crash lost its result. It
never retries a handler that failed.
"""

from __future__ import annotations

import datetime
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, overload

from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypeVar

from . import _json
from ._schema.check import json_type, schema_problems
from ._schema.plain import plain_check
from ._tool_signature import input_schema, read_signature
from .errors import ConfigurationError, ToolArgumentsError
from .messages import ToolSpec
from .stores.base import Schedule

if TYPE_CHECKING:
    import httpx

DepsT = TypeVar("DepsT", default=Any)
"""The type of `run(..., deps=...)`, which handlers get as `ctx.deps`.
`Any` where nothing says otherwise, so `Agent` and `ToolContext` need no parameter."""

Handler = Callable[[Any, "ToolContext[Any]"], Awaitable[Any] | Any]


# Not slots=True: on Python 3.11 a frozen slotted generic dataclass cannot be
# built through its alias (`ToolContext[Deps](...)` raises TypeError).
@dataclass(frozen=True)
class ToolContext(Generic[DepsT]):
    """What a handler knows about the call it serves.

    `idempotency_key` is stable for one tool call: the same when a
    `safe_to_retry` tool is re-invoked on resume, different for every other
    call. Pass it to providers that deduplicate (an `Idempotency-Key` header)
    and a side effect lands once even where the kit cannot know if it did.
    `resumed` is True when the call is a re-invocation after a crash. `now` is the
    time from the run's injected clock (`run(clock=)`), as an aware UTC datetime.
    `deps` is whatever was passed as `run(..., deps=...)`: annotate the
    handler's `ctx: ToolContext[MyDeps]` to have it typed (plain
    `ToolContext` is `ToolContext[Any]`).
    """

    session_id: str
    tool_call_id: str
    tool_name: str
    idempotency_key: str
    resumed: bool = False
    deps: DepsT = None  # type: ignore[assignment]  # None when run() was given no deps
    schedules: Any = field(default=None, repr=False, compare=False)  # a StepSchedules
    clock: Callable[[], float] | None = field(default=None, repr=False, compare=False)
    # The run's agents, for agent tools (a `_turn.delegation.Delegation`; None without).
    delegation: Any = field(default=None, repr=False, compare=False)

    @property
    def now(self) -> datetime.datetime:
        """The current time by the run's clock (UTC); read at each access."""
        seconds = self.clock() if self.clock is not None else time.time()
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC)

    def schedule(
        self,
        message: str,
        *,
        delay_seconds: float | None = None,
        at: str | datetime.datetime | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        every_seconds: int | None = None,
    ) -> Schedule:
        """Run `message` as a turn of this session later: `delay_seconds` from now, or
        `at` (ISO 8601 with a zone, or an aware datetime); or on a rhythm, each
        occurrence once: `cron` ("0 9 * * 1-5") in `timezone` (an IANA name,
        default UTC), or every `every_seconds` (60 or more; from `at` if given).
        Durable with the step: it is
        stored in the same write as this call's result, and only if the handler
        returns (one that raises schedules nothing). Returns the schedule (its
        `schedule_id` cancels it). ScheduleError for a bad time or message, more
        than MAX_SCHEDULES_PER_CALL from one call, or a session that would hold more
        than MAX_SCHEDULES_PER_SESSION (counted with what is stored and what the
        step's other calls scheduled). See `durable_agents.schedules`."""
        if self.schedules is None:
            raise ConfigurationError(
                "ctx.schedule needs a durable run: call the tool through run() with a store"
            )
        made: Schedule = self.schedules.add(
            message, delay_seconds=delay_seconds, at=at, cron=cron, timezone=timezone,
            every_seconds=every_seconds,
        )  # fmt: skip
        return made


# Not slots=True, as for ToolContext.
@dataclass(frozen=True)
class RunContext(Generic[DepsT]):
    """What a turn knows before its first LLM call: what `Agent.instructions` (when a
    function) and toolsets (`Agent.toolsets`) are given.

    `now` is when the turn started, from the run's injected clock (`run(clock=)`),
    as an aware UTC datetime. `settings` are the deployment's settings (in a
    Worker: those the agent module's `SETTINGS` and its toolsets name, from env; on
    CPython `run(settings=)`, default `os.environ`). `http` is the client handlers use
    (`run(http=)`; in a Worker, the one over `fetch`); without one, `run()` makes one
    for an agent's toolsets and closes it when the turn ends (None for an agent without
    toolsets).
    """

    session_id: str
    session_name: str | None
    now: datetime.datetime
    deps: DepsT = None  # type: ignore[assignment]  # None when run() was given no deps
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)
    http: httpx.AsyncClient | None = field(default=None, repr=False, compare=False)


class Toolset(Protocol):
    """Tools an agent gets from somewhere else at run time (`Agent(toolsets=[...])`),
    listed once per turn. `durable_agents.mcp.MCPTools` is one.

    Its tools carry their handlers, a `source` (e.g. `"mcp:notes"`) and what the
    source said of them (`annotations`). The kit stores with each call of such a
    tool what it decided for it (`ToolCall.policy`), so a resume goes by that.
    `settings` names the settings it reads, so the Worker passes them and the dev
    server lists them.
    """

    @property
    def settings(self) -> tuple[str, ...]: ...

    async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]: ...


@dataclass(frozen=True, slots=True)
class Tool:
    """A declared tool. Build it with `tool(...)`; see the module docstring.

    `input_model` is the pydantic model of the model form; `input_adapter` checks the
    arguments of a tool made from plain parameters (or from one dataclass or TypedDict
    parameter): `parse_arguments` makes the dict of their values (or the instance),
    which `handler` passes to the function's parameters.

    A toolset's tools also have a `source` (where they came from, `"mcp:notes"`)
    and `annotations` (what the source said of them, e.g. MCP's `readOnlyHint`).
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    input_model: type[BaseModel] | None = None
    output: TypeAdapter[Any] | None = None
    safe_to_retry: bool = False
    handler: Handler | None = None
    timeout: float | None = None
    requires_approval: bool = False
    source: str | None = None
    annotations: Mapping[str, Any] | None = None
    input_adapter: TypeAdapter[Any] | None = None
    # Built once per tool from `input_schema` (`_schema.plain`), not once per call.
    _fits: Callable[[dict[str, Any]], bool] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fits", plain_check(self.input_schema))

    @property
    def spec(self) -> ToolSpec:
        """What the LLM is told about this tool."""
        return ToolSpec(self.name, self.description, self.input_schema)

    @property
    def policy(self) -> dict[str, Any] | None:
        """What is stored with a call of this tool (`ToolCall.policy`): for a toolset's
        tool, the decision and what it rests on; None for the agent's own tools."""
        if self.source is None:
            return None
        return {
            "source": self.source,
            "safe_to_retry": self.safe_to_retry,
            "requires_approval": self.requires_approval,
            "annotations": dict(self.annotations or {}),
            "input_schema": self.input_schema,
        }

    def with_handler(self, handler: Handler) -> Tool:
        """This declaration with `handler` (what `run(..., tools={name: handler})` does)."""
        return replace(self, handler=handler)

    def parse_arguments(self, arguments: Any) -> Any:
        """The handler's `args`: the model instance, what `input_adapter` made (the
        values of plain parameters as a dict), or the dict checked against the schema;
        else ToolArgumentsError."""
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                f"arguments must be a JSON object, got {json_type(arguments)}",
                tool_name=self.name,
            )
        try:
            if self.input_model is not None:
                return self.input_model.model_validate(arguments)
            if self.input_adapter is not None:
                return self.input_adapter.validate_python(arguments)
        except ValidationError as exc:
            raise ToolArgumentsError(validation_summary(exc), tool_name=self.name) from None
        if self._fits is not None and self._fits(arguments):
            return arguments  # what schema_problems would find nothing in
        problems = schema_problems(arguments, self.input_schema, "arguments")
        if problems:
            said = "; ".join(f"{p.path}: {p.why}" for p in problems)
            raise ToolArgumentsError(said, tool_name=self.name)
        return arguments

    def encode_result(self, value: Any) -> str:
        """The stored result text. Raises ValueError if the value breaks the output schema,
        is not JSON, or nests deeper than `_json.MAX_DEPTH` (128) levels (JSON text
        included): such a result could not be read back, and on Pyodide even
        encoding it overflows the stack."""
        _json.check_depth(value)
        if self.output is not None:
            try:
                checked = self.output.validate_python(value)
            except ValidationError as exc:
                problems = validation_summary(exc)
                raise ValueError(f"it does not match the output schema: {problems}") from None
            content = self.output.dump_json(checked).decode()
        elif isinstance(value, str):
            content = value
        elif isinstance(value, BaseModel):
            content = value.model_dump_json()
        else:
            try:
                content = json.dumps(value, ensure_ascii=False, allow_nan=False)
            except TypeError as exc:
                raise ValueError(f"the handler returned a value that is not JSON: {exc}") from None
            except ValueError:
                raise ValueError(
                    "the handler returned NaN or an infinity, which JSON cannot hold"
                ) from None
        if content.lstrip().startswith(("[", "{")):
            _json.check_text_depth(content)  # a model's fields, or a str of JSON
        return _json.repair_text(content)  # stored as UTF-8: lone surrogates become U+FFFD


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    input: type[BaseModel] | dict[str, Any],
    output: Any = None,
    safe_to_retry: bool = False,
    handler: Handler | None = None,
    timeout: float | None = None,
    requires_approval: bool = False,
) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    safe_to_retry: bool = False,
    timeout: float | None = None,
    requires_approval: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    input: type[BaseModel] | dict[str, Any] | None = None,
    output: Any = None,
    safe_to_retry: bool = False,
    handler: Handler | None = None,
    timeout: float | None = None,
    requires_approval: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool, or decorate a handler into one.

    - `@tool` / `@tool(safe_to_retry=True, name=..., timeout=...)` on a function: the
      name comes from the function, the output schema from its return annotation,
      the input schema from its parameters. The parameter annotated `ToolContext`
      (or `ToolContext[Deps]`; anywhere, first or last) gets the call's context;
      every other parameter is an argument the model sends:

      - plain parameters, `async def search(ctx: ToolContext, query: str, limit:
        int = 10)`: the schema pydantic-ai builds from the signature (types,
        defaults, `Field`/`Annotated` constraints, `$defs` for nested models, no
        other keys), each argument described by the docstring's `Args:` (Google,
        NumPy or Sphinx style), the tool by the rest of the docstring; the
        handler gets the checked values;
      - one pydantic model, `(args: InModel, ctx: ToolContext)`: the model's own
        schema, the whole docstring as the description; the handler gets the
        instance (a dataclass or TypedDict: its schema, as pydantic-ai makes it);
      - one `dict`/`Any`/unannotated parameter: any object, as sent; none: no
        arguments.

      `**kwargs` is refused; `*args` is an array argument. An unannotated
      parameter named `ctx` (or the second of `(args, ctx)`) is the context too.
    - `tool(name=..., description=..., input=InModel | json_schema_dict,
      output=OutType | None, safe_to_retry=False, handler=None)`: a declaration;
      the handler may come later through `run(..., tools={name: handler})`, and
      takes `(args, ctx)`.

    `timeout` (seconds) turns an async handler that runs too long into an error
    result. `requires_approval=True`: the call waits for a person's decision
    (`durable_agents.approve`) bound to its exact arguments before it runs;
    `run()` returns `status="awaiting_approval"` meanwhile. A sync handler runs
    to completion on the event loop (keep it quick; Workers have no threads to
    move it to).
    """
    if fn is not None:
        return _from_function(fn, name, description, safe_to_retry, timeout, requires_approval)
    if input is None and handler is None:
        return lambda f: _from_function(
            f, name, description, safe_to_retry, timeout, requires_approval
        )
    if not name:
        raise ConfigurationError("a tool declaration needs a name")
    model, schema = input_schema(name, input if input is not None else {})
    return Tool(
        name=_check_name(name),
        description=description or "",
        input_schema=schema,
        input_model=model,
        output=_output_adapter(output),
        safe_to_retry=safe_to_retry,
        handler=handler,
        timeout=timeout,
        requires_approval=requires_approval,
    )


def _from_function(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    safe_to_retry: bool,
    timeout: float | None,
    requires_approval: bool = False,
) -> Tool:
    tool_name = _check_name(name or fn.__name__)
    reading = read_signature(tool_name, fn, context=ToolContext, run_context=RunContext)
    said = reading.description if reading.description is not None else inspect.getdoc(fn)
    return Tool(
        name=tool_name,
        description=description or said or "",
        input_schema=reading.schema,
        input_model=reading.model,
        input_adapter=reading.adapter,
        output=_output_adapter(reading.returns),
        safe_to_retry=safe_to_retry,
        handler=reading.call,
        timeout=timeout,
        requires_approval=requires_approval,
    )


def _output_adapter(output: Any) -> TypeAdapter[Any] | None:
    if output is None or output is type(None) or output is Any or output is str:
        return None
    return TypeAdapter(output)


def _check_name(name: str) -> str:
    # The strictest provider rule (Anthropic, OpenAI): ^[a-zA-Z0-9_-]{1,64}$
    if not (0 < len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)):
        raise ConfigurationError(
            f"tool name {name!r} must be 1-64 characters of letters, digits, '_' or '-'"
        )
    return name


def validation_summary(exc: ValidationError) -> str:
    """One line naming each problem pydantic found (`where: what`), as the model reads it."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "(root)"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
