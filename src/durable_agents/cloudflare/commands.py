"""What the Worker asks a session's Durable Object to do: one discriminated union of models.

The Worker builds a command from a request it checked (`routes.py`), sends it as
JSON (`to_json`), and the object reads it back with the same models (`from_json`):
a command is validated once per side by one definition. Members that carry a
request body extend that body's model (`bodies.py`), so the object checks what the
Worker checked. The object's handler for each member is in `session_object.py`'s
table; the HTTP routes in docs/http-api.md#routes.
"""

from __future__ import annotations

import functools
import json
import re
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .. import _json
from ..limits import MAX_BOUND_INT
from ..messages import CALL_ID, MessageOrigin
from .bodies import ApprovalBody, MessageBody, ScheduleBody, matching

__all__ = [
    "HISTORY_LIMIT",
    "MAX_HISTORY_LIMIT",
    "MAX_VIEW_LIMIT",
    "REQUEST_KEY",
    "SCHEDULE_ID",
    "SERVED_NAME",
    "SESSION_NAME",
    "TOOL_CALL_ID",
    "VIEW_LIMIT",
    "Approve",
    "Cancel",
    "Command",
    "Decision",
    "Delete",
    "Events",
    "History",
    "ListApprovals",
    "ListSchedules",
    "Resume",
    "Schedule",
    "ScheduleSpec",
    "SendMessage",
    "Stop",
    "Unschedule",
    "View",
    "command_types",
]

SESSION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A served agent's name: its module's stem in src/agents/ (served_agents.py).
SERVED_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
REQUEST_KEY = re.compile(r"[!-~]{1,255}")  # printable ASCII, as Stripe-style keys are
TOOL_CALL_ID = CALL_ID  # every id the kit stores for a call (run() gives others its own)
SCHEDULE_ID = re.compile(r"[A-Za-z0-9_.:~-]{1,100}")
# Pages of one session's messages: GET /sessions/{name} and GET .../view answer at most
# `limit` messages (these defaults and maxima; the page's bytes are `reads.py`'s).
HISTORY_LIMIT, MAX_HISTORY_LIMIT = 200, 1000
MAX_AGENT_DEPTH = 100  # a child turn's depth: agent_tool(max_depth=) stops loops far sooner
VIEW_LIMIT, MAX_VIEW_LIMIT = 100, 500

SessionName = Annotated[StrictStr, matching(SESSION_NAME, "session-name")]
ServedName = Annotated[StrictStr, matching(SERVED_NAME, "served-name")]
RequestKey = Annotated[StrictStr, matching(REQUEST_KEY, "request-key")]
CallId = Annotated[StrictStr, matching(TOOL_CALL_ID, "tool-call-id")]
ScheduleId = Annotated[StrictStr, matching(SCHEDULE_ID, "schedule-id")]
Position = Annotated[StrictInt, Field(ge=0, le=MAX_BOUND_INT)]  # a message's place


class Command(BaseModel):
    """One command to a session's object; `name` is the session's name as the client gave it,
    `agent` the served agent's (`/agents/{agent}/sessions/...`; None: the default agent's).

    `Command("message", "hi", "key-1", stream=True)` builds the union's member for
    that action (`SendMessage(message="hi", request_key="key-1", stream=True)`), and
    refuses, as `from_json` does, what no member takes: a shorthand for tests.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: str  # each member's own: the discriminator
    name: SessionName | None = None
    agent: ServedName | None = None

    def __new__(cls, *args: Any, **fields: Any) -> Command:
        if cls is not Command:
            return super().__new__(cls)
        action = args[0] if args else fields.pop("action")
        given = {k: v for k, v in fields.items() if v is not None}
        given.update(zip(("message", "request_key"), args[1:], strict=False))
        try:
            return _command_union().validate_python({"action": action, **given})
        except ValidationError as exc:
            raise ValueError(f"not a command: {exc}") from None

    def __init__(self, *args: Any, **fields: Any) -> None:
        if not args:  # with args, `__new__` built it already
            super().__init__(**fields)

    @property
    def runs_turn(self) -> bool:
        return isinstance(self, SendMessage | Resume | Approve | Stop)

    def to_json(self) -> str:
        """The command as it crosses to the object (`origin` never does)."""
        # json.dumps, not pydantic's JSON: a lone surrogate a client escaped in its JSON
        # ("\ud800") crosses as it did before, for the store to repair.
        return json.dumps(self.model_dump(exclude_none=True), ensure_ascii=False)

    @staticmethod
    def from_json(text: str) -> Command:
        """The Worker's command, checked by the same models; ValueError if it is none."""
        # One level deeper than the request body it carries (a decision's edited
        # arguments sit inside "decision"), which was held to MAX_DEPTH.
        data = _json.loads(text, max_depth=_json.MAX_DEPTH + 1)
        # `origin` and `stop` are the object's own: set by its alarm, never sent.
        if not isinstance(data, dict) or "origin" in data or data.get("action") == "stop":
            raise ValueError(f"not a command: {text[:200]!r}")
        try:
            return _command_union().validate_python(data)
        except ValidationError:
            raise ValueError(f"not a command: {text[:200]!r}") from None


class _Turn(Command):
    """A command that runs a turn; `stream` answers it as server-sent events."""

    stream: StrictBool = False
    # Set by the object itself, never sent: the turns its alarm runs ("self-resumed",
    # "scheduled", "stopped").
    origin: MessageOrigin | None = Field(default=None, exclude=True)
    # Sent by a parent session's object only (`agent_calls.py`), never built from a
    # client's body: the turn is an agent tool's child turn, this deep (1 under a
    # top-level turn), and its answer carries the child session's usage.
    depth: Annotated[StrictInt, Field(ge=1, le=MAX_AGENT_DEPTH)] | None = None

    def turn_key(self) -> str | None:
        """What names this command's turn while it waits or runs (`LiveSession.find`), so a
        chat client can stop its own turn and no other: none for most."""
        return None


class SendMessage(_Turn, MessageBody):
    """POST .../messages: run a turn with `message`; `request_key` is its Idempotency-Key."""

    action: Literal["message"] = "message"
    request_key: RequestKey | None = None
    # Sent with `depth` by a parent session's object only: the agent-tool call this child
    # turn answers (`ParentCall.key`, "<parent session id>/<call id>"), stored with its
    # first write so the child session links back to it.
    parent_call: Annotated[StrictStr, Field(min_length=3, max_length=400)] | None = None

    def turn_key(self) -> str | None:
        return None if self.request_key is None else f"message:{self.request_key}"


class Resume(_Turn):
    """POST .../resume: finish an interrupted turn."""

    action: Literal["resume"] = "resume"


class Stop(_Turn):
    """The alarm's: end a turn whose resumes kept crashing; `message` says why."""

    action: Literal["stop"] = "stop"
    message: str | None = None


class Decision(ApprovalBody):
    """A person's decision (the body of POST .../approvals/{tool_call_id}) on that call."""

    tool_call_id: CallId


class Approve(_Turn):
    """Decide one call, then go on with the turn if it was the step's last decision."""

    action: Literal["approve"] = "approve"
    decision: Decision

    def turn_key(self) -> str | None:
        return f"approve:{self.decision.tool_call_id}"


class History(Command):
    """GET /sessions/{name}: a page of the stored messages after `after`."""

    action: Literal["history"] = "history"
    after: Position | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_HISTORY_LIMIT)] | None = None


class View(Command):
    """GET .../view: a page of the timeline, after `after` or before `before`."""

    action: Literal["view"] = "view"
    after: Position | None = None
    before: Position | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_VIEW_LIMIT)] | None = None

    @model_validator(mode="after")
    def _one_side(self) -> View:
        if self.after is not None and self.before is not None:
            raise PydanticCustomError("after-and-before", "give after or before, not both")
        return self


class Events(Command):
    """GET .../events: the stored messages after `after`, then the running turn live.

    `follow=False` (a parent session's object replaying its agent tool's child session,
    `agent_calls.py`; the Worker never sets it) ends the stream after the messages stored
    when asked, with no `done`."""

    action: Literal["events"] = "events"
    after: Position | None = None
    follow: StrictBool = True


class ListApprovals(Command):
    """GET .../approvals: the calls waiting for a decision."""

    action: Literal["approvals"] = "approvals"


class Cancel(Command):
    """POST .../cancel: stop the running turn at its next step boundary."""

    action: Literal["cancel"] = "cancel"


class Delete(Command):
    """DELETE /sessions/{name} (and the retention cron): delete the session."""

    action: Literal["delete"] = "delete"


class ScheduleSpec(ScheduleBody):
    """A schedule body the Worker checked, time included: exactly one of the two times,
    or a rule (checked again by the object, with its own clock)."""

    @model_validator(mode="after")
    def _one_time(self) -> ScheduleSpec:
        once = self.cron is None and self.every_seconds is None
        if once and (self.delay_seconds is None) == (self.at is None):
            raise PydanticCustomError("one-time", "give exactly one of delay_seconds and at")
        return self


class Schedule(Command):
    """POST .../schedules: store a schedule (`durable_agents.schedules`)."""

    action: Literal["schedule"] = "schedule"
    schedule: ScheduleSpec


class ListSchedules(Command):
    """GET .../schedules: the schedules waiting."""

    action: Literal["schedules"] = "schedules"


class Unschedule(Command):
    """DELETE .../schedules/{schedule_id}: cancel one."""

    action: Literal["unschedule"] = "unschedule"
    schedule_id: ScheduleId


def command_types() -> tuple[type[Command], ...]:
    """Every command the object serves: each class under `Command` that names its
    `action`. Defining one is all it takes to add it to the union."""
    found: list[type[Command]] = []
    pending = list(Command.__subclasses__())
    while pending:
        member = pending.pop(0)
        pending.extend(member.__subclasses__())
        action = member.model_fields["action"].annotation
        if typing.get_origin(action) is Literal:
            found.append(member)
    return tuple(found)


@functools.cache
def _command_union() -> TypeAdapter[Command]:
    """The discriminated union of `command_types()`, validated by one model on both sides
    of the Worker -> object hop; built on first use, once every member is defined."""
    members = command_types()
    # A union assembled at run time, which a type checker cannot follow.
    union = Annotated[Union[members], Field(discriminator="action")]  # type: ignore[valid-type]  # noqa: UP007
    return TypeAdapter(union)
