"""The conversation's data: messages, tool calls, tool specs, LLM responses, usage.

These are plain frozen dataclasses, provider-neutral. LLM adapters translate
them to and from a provider's wire format; stores persist them. The JSON codec
here (`to_dict` / `from_dict`) is what the HTTP API and the CLI print.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from . import _json

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
MessageOrigin = Literal["scheduled", "self-resumed", "stopped", "agent-tool"]
ORIGINS: tuple[str, ...] = ("scheduled", "self-resumed", "stopped", "agent-tool")


OUTPUT_TOOL = "final_result"
"""The tool through which a model gives a typed answer (`Agent(output_type=...)`)."""

CALL_ID = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.:~-]{1,255}")
"""The ids the kit stores for calls: what a URL path segment, a header and a log line
carry as they are (`/sessions/{name}/approvals/{tool_call_id}` accepts exactly these)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool invocation requested by the LLM.

    `id` is the call's id in the kit: the provider's, unless it was empty, a
    duplicate in the session or not a `CALL_ID` (`"a/b"`, `"café"`, 300
    characters): then the run loop gives the call an id of its own before it
    is stored, and keeps the provider's as `provider_id`, which is what the
    provider gets back on the next call (`wire_id`). So every stored call can
    be matched to exactly one result and named in a URL.

    `policy` is what the kit decided for the call when it stored it (write #1),
    for a tool that came from a toolset (`Agent(toolsets=...)`, e.g. an MCP
    server's): `{"source", "safe_to_retry", "requires_approval", "annotations",
    "input_schema"}`. A resume decides by it, not by what the toolset lists
    today. None for the agent's own tools, whose declaration is in the code.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    provider_id: str | None = None
    policy: Mapping[str, Any] | None = None

    @property
    def wire_id(self) -> str:
        """The id to send the provider: its own, when the kit stored another."""
        return self.provider_id or self.id

    def to_dict(self) -> dict[str, Any]:
        data = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.provider_id is not None:
            data["provider_id"] = self.provider_id
        if self.policy is not None:
            data["policy"] = dict(self.policy)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        arguments = data.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise ValueError(
                f"tool call arguments must be an object, got {type(arguments).__name__}"
            )
        call_id, name = str(data.get("id") or ""), str(data["name"])
        provider_id = data.get("provider_id")
        provider_id = None if provider_id is None else str(provider_id)
        policy = data.get("policy")
        policy = dict(policy) if isinstance(policy, dict) else None
        if data.get("arguments_error"):
            return MalformedToolCall(
                call_id,
                name,
                {},
                provider_id,
                policy,
                raw_arguments=str(data.get("raw_arguments") or ""),
                arguments_error=str(data["arguments_error"]),
            )
        return cls(call_id, name, arguments, provider_id, policy)


@dataclass(frozen=True, slots=True)
class MalformedToolCall(ToolCall):
    """A tool call whose arguments the model wrote as something other than a
    JSON object (broken JSON, a list, a cut-off block). Its `arguments` are `{}`;
    `raw_arguments` holds what the model wrote and `arguments_error` a sentence
    for the model. The run loop answers it with an `invalid-arguments` result and
    never calls the handler, so a tool is never run on guessed arguments.
    """

    raw_arguments: str = ""
    arguments_error: str = ""

    def to_dict(self) -> dict[str, Any]:
        # Stored with the call, so a call resumed after a crash is still known
        # to be malformed and is never handed to a handler with `{}`.
        return {
            **ToolCall.to_dict(self),
            "raw_arguments": self.raw_arguments,
            "arguments_error": self.arguments_error,
        }


MAX_CALL_TOKENS = 2**32 - 1
"""The most tokens one LLM call is counted for (each of input and output); a provider's
larger, negative or non-integer count is taken as this bound or 0. Far past any model's
context, and small enough that a session's totals stay integers every store binds."""


def token_count(value: Any) -> int:
    """A token count as stored: an int within 0..MAX_CALL_TOKENS (0 for a non-integer)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return 0
    return max(0, min(value, MAX_CALL_TOKENS))


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens used by LLM calls. Adds up with `+`."""

    input_tokens: int = 0
    output_tokens: int = 0

    def bounded(self) -> Usage:
        """This usage with each count within 0..MAX_CALL_TOKENS (as a store keeps it)."""
        inp, out = token_count(self.input_tokens), token_count(self.output_tokens)
        if (inp, out) == (self.input_tokens, self.output_tokens):
            return self
        return Usage(inp, out)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True, slots=True)
class ParentCall:
    """The agent-tool call of another session that a child session's turn answers: the
    parent's session id and the call's id (what `child_session_name` derives the
    child's name from). Stored with the child's first write, on the user message that
    starts its turn (`Message.parent_call`), so a child session knows its parent."""

    session_id: str
    call_id: str

    @property
    def key(self) -> str:
        """How the record is stored: `{session_id}/{call_id}` in the user message's
        `tool_call_id` (a call id never holds a `/`, so it splits back at the last one)."""
        return f"{self.session_id}/{self.call_id}"

    @classmethod
    def from_key(cls, key: str) -> ParentCall | None:
        session_id, slash, call_id = key.rpartition("/")
        return cls(session_id, call_id) if slash and session_id and call_id else None


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of a conversation.

    - `system` / `user`: `content` is the text.
    - `assistant`: `content` is the text (may be empty) and `tool_calls` the
      calls it requested; `usage` is what the LLM call that produced it cost,
      stored with it so token accounting survives a crash.
    - `tool`: the result of one call: `tool_call_id`, `tool_name`, and
      `content` (a string; JSON with an `error` key when the call failed).

    `request_key` (user messages) is the caller's idempotency key for the
    turn the message started: see `run(..., request_key=...)`.

    A stored `system` message is a summary (`Message.summary`): it stands for
    the session's messages at positions `0 .. summary_of - 1` in what the
    model is sent (see `Agent.max_context_tokens`); those stay stored.

    `origin` says who started the turn the message belongs to, when it was not
    a client: `"scheduled"` (a schedule's message and its turn), `"self-resumed"`
    (written by a resume nobody asked for: the session's Durable Object alarm or
    the `durable-agents worker`), `"stopped"` (the kit's note that ends a turn
    whose resumes kept crashing), `"agent-tool"` (a turn another session's agent
    tool ran: its user message records that call, `parent_call`). None for
    everything else.

    `instructions` (on the user message that starts a turn, or on a summary that
    folded it) are the instructions the turn's LLM calls were sent, when the
    agent's `instructions` is a function (`Agent.instructions`): evaluated once,
    when the turn starts, and stored with its first write, so a resumed turn
    sends the model what it saw before. None for fixed instructions.
    """

    role: Role
    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    usage: Usage | None = None
    request_key: str | None = None
    summary_of: int | None = None
    origin: MessageOrigin | None = None
    instructions: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown message role {self.role!r}; expected one of {sorted(ROLES)}")
        if self.origin is not None and self.origin not in ORIGINS:
            raise ValueError(f"unknown message origin {self.origin!r}; expected one of {ORIGINS}")
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        # Stored and sent as UTF-8: no lone surrogates. ASCII text has none (checked
        # without a scan): what a long history loads is mostly that.
        content, instructions = self.content, self.instructions
        if isinstance(content, str) and not content.isascii():
            object.__setattr__(self, "content", _json.repair_text(content))
        if isinstance(instructions, str) and not instructions.isascii():
            object.__setattr__(self, "instructions", _json.repair_text(instructions))
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", text)

    @classmethod
    def summary(cls, text: str, summary_of: int) -> Message:
        """A summary of the session's first `summary_of` messages (a system message)."""
        return cls("system", text, summary_of=summary_of)

    @property
    def is_summary(self) -> bool:
        return self.summary_of is not None

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", text)

    @classmethod
    def assistant(
        cls, text: str = "", tool_calls: Sequence[ToolCall] = (), usage: Usage | None = None
    ) -> Message:
        return cls("assistant", text, tuple(tool_calls), usage=usage)

    @classmethod
    def tool_result(cls, call: ToolCall, content: str) -> Message:
        return cls("tool", content, tool_call_id=call.id, tool_name=call.name)

    @property
    def parent_call(self) -> ParentCall | None:
        """The parent's call this message's turn answers: on the user message of a turn
        an agent tool started (origin "agent-tool"), which keeps it in `tool_call_id`
        as `ParentCall.key`, a column no other user message uses. None on any other."""
        if self.role != "user" or self.origin != "agent-tool" or not self.tool_call_id:
            return None
        return ParentCall.from_key(self.tool_call_id)

    @property
    def is_final_reply(self) -> bool:
        """An assistant message that asks for no tool: the end of a turn."""
        return self.role == "assistant" and not self.tool_calls

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.tool_name is not None:
            data["tool_name"] = self.tool_name
        if self.usage is not None:
            data["usage"] = self.usage.to_dict()
        if self.request_key is not None:
            data["request_key"] = self.request_key
        if self.summary_of is not None:
            data["summary_of"] = [0, self.summary_of]  # the positions it stands for
        if self.origin is not None:
            data["origin"] = self.origin
        if self.instructions is not None:
            data["instructions"] = self.instructions
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        usage = data.get("usage")
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls") or ()),
            tool_call_id=data.get("tool_call_id"),
            tool_name=data.get("tool_name"),
            usage=Usage(**usage) if usage else None,
            request_key=data.get("request_key"),
            summary_of=_summary_end(data.get("summary_of")),
            origin=data.get("origin"),
            instructions=data.get("instructions"),
        )


class _MessageSlots:
    """Message's slots without its frozen `__setattr__`: `stored_message` fills one with
    plain (specialised) attribute stores, then makes it the Message it is by setting its
    class, which the identical slot layout allows. A frozen dataclass's `__init__` sets
    each field through `object.__setattr__` instead, which took 4x the time: a history
    loads one message a row."""

    __slots__ = Message.__slots__


def stored_message(
    role: Role,
    content: str,
    tool_calls: tuple[ToolCall, ...],
    tool_call_id: str | None,
    tool_name: str | None,
    usage: Usage | None,
    request_key: str | None,
    summary_of: int | None,
    origin: MessageOrigin | None,
    instructions: str | None,
) -> Message:
    """`Message(role, content, ...)`, the same object with the same checks and repairs
    (`Message.__post_init__`), built at a quarter of the cost: what the stores' row
    loaders call for each row. Anything `__post_init__` would refuse or convert goes
    through `Message` itself, so it raises or converts exactly as it does."""
    if (
        role not in ROLES
        or (origin is not None and origin not in ORIGINS)
        or type(tool_calls) is not tuple
        or (role == "tool" and not tool_call_id)
    ):
        return Message(
            role, content, tool_calls, tool_call_id, tool_name, usage, request_key,
            summary_of, origin, instructions,
        )  # fmt: skip
    if isinstance(content, str) and not content.isascii():
        content = _json.repair_text(content)
    if isinstance(instructions, str) and not instructions.isascii():
        instructions = _json.repair_text(instructions)
    built = _MessageSlots()
    built.role = role  # type: ignore[attr-defined]
    built.content = content  # type: ignore[attr-defined]
    built.tool_calls = tool_calls  # type: ignore[attr-defined]
    built.tool_call_id = tool_call_id  # type: ignore[attr-defined]
    built.tool_name = tool_name  # type: ignore[attr-defined]
    built.usage = usage  # type: ignore[attr-defined]
    built.request_key = request_key  # type: ignore[attr-defined]
    built.summary_of = summary_of  # type: ignore[attr-defined]
    built.origin = origin  # type: ignore[attr-defined]
    built.instructions = instructions  # type: ignore[attr-defined]
    built.__class__ = Message  # type: ignore[assignment]
    return built  # type: ignore[return-value]


def _summary_end(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2 and value[0] == 0 and type(value[1]) is int:
        return value[1]
    raise ValueError(f"summary_of must be [0, n], got {value!r}")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the LLM is told about a tool: its name, description and input JSON schema."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LLMResponse:
    """One LLM reply: text, the tool calls it requests (maybe none), and usage.

    A call whose arguments nest deeper than `_json.MAX_DEPTH` (128) levels
    becomes a `MalformedToolCall`: it is answered `invalid-arguments` and
    never stored or run as it is (encoding it could overflow the stack).
    """

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None

    def __post_init__(self) -> None:
        # Whatever the model sent, what is stored is strict JSON in valid UTF-8:
        # lone surrogates become U+FFFD, non-finite or too-deep arguments make
        # the call malformed (answered, never run), usage counts are bounded.
        object.__setattr__(self, "text", _json.repair_text(self.text))
        object.__setattr__(self, "tool_calls", [_clean_call(c) for c in self.tool_calls])
        if self.usage is not None:
            object.__setattr__(self, "usage", self.usage.bounded())


def _clean_call(call: ToolCall) -> ToolCall:
    """`call` with valid UTF-8 text, or a `MalformedToolCall` if its arguments cannot be
    stored as strict JSON. Returns `call` itself when nothing needed a change (never
    compare the calls: == on a too-deep value recurses)."""
    call_id, name = _json.repair_text(call.id), _json.repair_text(call.name)
    provider_id = None if call.provider_id is None else _json.repair_text(call.provider_id)
    if isinstance(call, MalformedToolCall):
        raw, error = _json.repair_text(call.raw_arguments), _json.repair_text(call.arguments_error)
        if (call_id, name, provider_id, raw, error) == (
            call.id, call.name, call.provider_id, call.raw_arguments, call.arguments_error
        ):  # fmt: skip
            return call
        return MalformedToolCall(
            call_id, name, {}, provider_id, raw_arguments=raw, arguments_error=error
        )
    try:
        arguments = _json.clean(call.arguments)
    except ValueError as exc:
        fix = "flatter arguments" if isinstance(exc, _json.JSONTooDeepError) else "finite numbers"
        error = (
            f"The arguments for tool {name!r} were refused ({exc}), so the tool was not run. "
            f"Call it again with {fix}."
        )
        return MalformedToolCall(call_id, name, {}, provider_id, arguments_error=error)
    if arguments is call.arguments and (call_id, name, provider_id) == (
        call.id, call.name, call.provider_id
    ):  # fmt: skip
        return call
    return ToolCall(call_id, name, arguments, provider_id)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the reply's text as a streaming LLM call produces it.

    A preview only: the stored message is the truth (a retried stream may
    word its text differently from what was already shown).
    """

    text: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", _json.repair_text(self.text))


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call as a streaming LLM call produces it.

    `index` is the call's place in the reply; `id` and `name` come with its
    first piece (None after), `arguments` is the next piece of its JSON text.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


StreamPart = TextDelta | ToolCallDelta | LLMResponse
"""What `LLM.stream()` yields: deltas, then one `LLMResponse` (the same `chat()` returns)."""


class ToolErrorKind(StrEnum):
    """The `kind` of a failed tool call's result: `{"error": "<sentence>", "kind": K}`.

    The run loop stores one of these instead of a handler's result when the
    call could not run or its result could not be kept. The values are wire
    strings (stored, and sent to the LLM): never renamed. Compare a parsed
    result's `kind` with them (`tool_error(m.content)["kind"] == ToolErrorKind.TOOL_FAILED`).

        UNKNOWN_TOOL           the model named a tool the agent does not have
        INVALID_ARGUMENTS      its arguments break the input schema, or are not a
                               JSON object; the handler was not called
        TOOL_FAILED            the handler raised
        TOOL_TIMEOUT           a `safe_to_retry` handler ran past its `timeout`
        INVALID_OUTPUT         the handler's value breaks its output schema or is
                               not JSON; the handler ran, nothing was stored
        RESULT_TOO_LARGE       over `Agent.max_result_bytes`; the handler ran
        TOOL_DURABILITY_ERROR  an unsafe call whose outcome is unknown (its result
                               was lost in a crash, or it timed out or lost its
                               connection): `ToolDurabilityError`, with the keys
                               `toolName` and `toolCallId` besides
        TOOL_DENIED            a person denied the call (it needed approval); with
                               `toolName`, `toolCallId` and the decision's `reason`
        TOO_MANY_CALLS         the reply asked for more calls than the agent runs in
                               one step (`max_tool_calls_per_step`); this one was
                               not run
        TOOL_RETRY             the handler raised `ModelRetry`: its message says what
                               to change; the model may call again (at most
                               `Agent.max_tool_retries` times a turn per tool)
        UNKNOWN_AGENT          an agent tool names an agent the run was not given
                               (`run(agents=)`); with `agent`
        AGENT_DEPTH_EXCEEDED   an agent tool's turn would nest deeper than its
                               `max_depth`; nothing ran; with `agent`
        AGENT_FAILED           an agent tool's turn ended without an answer; with
                               `agent`, its `status` and its `session` (name)
    """

    UNKNOWN_TOOL = "unknown-tool"
    INVALID_ARGUMENTS = "invalid-arguments"
    TOOL_FAILED = "tool-failed"
    TOOL_TIMEOUT = "tool-timeout"
    INVALID_OUTPUT = "invalid-output"
    RESULT_TOO_LARGE = "result-too-large"
    TOOL_DURABILITY_ERROR = "tool-durability-error"
    TOOL_DENIED = "tool-denied"
    TOO_MANY_CALLS = "too-many-calls"
    TOOL_RETRY = "tool-retry"
    UNKNOWN_AGENT = "unknown-agent"
    AGENT_DEPTH_EXCEEDED = "agent-depth-exceeded"
    AGENT_FAILED = "agent-failed"


def tool_error_content(kind: ToolErrorKind, text: str, **fields: str | None) -> str:
    """The stored content of a failed call: `{"error": text, "kind": kind, **fields}` as JSON."""
    return json.dumps({"error": text, "kind": kind.value, **fields}, ensure_ascii=False)


def tool_error(content: str) -> dict[str, Any] | None:
    """The error object a tool result carries (JSON with an `error` key), or None.

    Every failed call's result has this shape: the run loop's own errors
    (`kind`, one of `ToolErrorKind`, says which) and the
    `tool-durability-error` of a lost result.
    """
    text = content.lstrip()
    if not text.startswith("{"):
        return None
    try:
        data = _json.loads(text)
    except ValueError:  # not JSON, or nested too deep to parse
        return None
    return data if isinstance(data, dict) and "error" in data else None


def encode_tool_calls(calls: Sequence[ToolCall]) -> str | None:
    """The JSON stored in the `tool_calls` column; None when there are none."""
    if not calls:
        return None
    return _CALLS_ENCODER.encode([c.to_dict() for c in calls])


# What `json.dumps(..., separators=(",", ":"), ensure_ascii=False)` builds on each call,
# built once: every step's first write encodes its calls.
_CALLS_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def decode_tool_calls(raw: str | None) -> tuple[ToolCall, ...]:
    """The calls stored by `encode_tool_calls` (malformed ones come back as such).

    ValueError for a column that is not such JSON, or nests deeper than the kit
    ever stores (`_json.STORED_MAX_DEPTH`).
    """
    if not raw:
        return ()
    calls = _json.loads(raw, max_depth=_json.STORED_MAX_DEPTH)
    return tuple([_stored_call(c) for c in calls])


class _ToolCallSlots:
    """ToolCall's slots without its frozen `__setattr__` (see `_MessageSlots`)."""

    __slots__ = ToolCall.__slots__


def _stored_call(data: Any) -> ToolCall:
    """`ToolCall.from_dict(data)`, built cheaply for what the kit stores for most calls,
    `{"id", "name", "arguments"}` with a non-empty id: anything else goes through
    `from_dict` itself."""
    if type(data) is dict and len(data) == 3:
        call_id, name, arguments = data.get("id"), data.get("name"), data.get("arguments")
        if type(call_id) is str and call_id and type(name) is str and type(arguments) is dict:
            built = _ToolCallSlots()
            built.id = call_id  # type: ignore[attr-defined]
            built.name = name  # type: ignore[attr-defined]
            built.arguments = arguments  # type: ignore[attr-defined]
            built.provider_id = None  # type: ignore[attr-defined]
            built.policy = None  # type: ignore[attr-defined]
            built.__class__ = ToolCall  # type: ignore[assignment]
            return built  # type: ignore[return-value]
    return ToolCall.from_dict(data)


def provider_call_ids(messages: Sequence[Message]) -> Mapping[str, str]:
    """Kit call id -> provider call id, for the calls the kit gave an id of its own: what
    an adapter sends back in place of `tool_call_id` (the calls themselves have `wire_id`)."""
    return {
        call.id: call.provider_id
        for message in messages
        for call in message.tool_calls
        if call.provider_id is not None
    }


def pending_tool_calls(history: Sequence[Message]) -> list[ToolCall]:
    """The calls of the last assistant message that have no stored result.

    Only the last assistant message can hold them: every step stores its results
    before the next LLM call, so an earlier step's calls are always answered.
    After a crash they are orphans; while a call waits for approval, it is one
    of these too (`durable_agents.approvals`).
    """
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.role == "assistant":
            answered = {m.tool_call_id for m in history[index + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in answered]
    return []
