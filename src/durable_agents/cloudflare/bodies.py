"""The request bodies the API takes, as pydantic models, and their errors in the API's words.

Each body model is the one place its fields are checked: the Worker validates a
request's JSON with it, and the command it sends its session's Durable Object
(`commands.py`) is built on the same model, so the object checks the same fields
again on its side of the hop. Their wording, as clients see it in a 422
`invalid-body`, is each model's `explain`. The bodies are listed in
docs/http-api.md#routes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from .. import _json
from .._schema.check import json_type
from .wire import Reply, error_reply

__all__ = [
    "DEFAULT_TOKEN_TTL_S",
    "DIGEST",
    "MAX_TOKEN_TTL_S",
    "ApprovalBody",
    "Body",
    "BodyReader",
    "MessageBody",
    "ResumeBody",
    "ScheduleBody",
    "TokenBody",
    "body_of",
    "matching",
    "read_json",
]

DIGEST = re.compile(r"[0-9a-f]{64}")
DEFAULT_TOKEN_TTL_S = 3600
MAX_TOKEN_TTL_S = 7 * 24 * 3600

BodyReader = Callable[[], Awaitable[bytes]]
BodyT = TypeVar("BodyT", bound="Body")


def matching(pattern: re.Pattern[str], error: str) -> AfterValidator:
    """A str check: the whole of it matches `pattern` (Python's `fullmatch`, so a
    trailing newline is refused), else the error type `error`."""

    def check(value: str) -> str:
        if pattern.fullmatch(value) is None:
            raise PydanticCustomError(error, "{pattern} does not match", {"pattern": error})
        return value

    return AfterValidator(check)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "the text is empty")
    return value


NonBlank = Annotated[StrictStr, AfterValidator(_not_blank)]


class Body(BaseModel):
    """A request body: a JSON object with these fields and no others."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        """The 422's message for a body that fails validation (`errors`, pydantic's)."""
        return f"the body is not a {cls.__name__}: {errors[0]['msg']}"


def _unknown(errors: list[ErrorDetails]) -> list[str]:
    """The fields a body has that its model does not, sorted (the first 10)."""
    return sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")[:10]


def _first_field(errors: list[ErrorDetails]) -> tuple[str, ErrorDetails]:
    """The first failing field (in the model's order) and its error; "" for the model's own."""
    error = errors[0]
    return (str(error["loc"][0]) if error["loc"] else ""), error


class MessageBody(Body):
    """POST /sessions/{name}/messages: `{"message": "..."}`, a non-empty string."""

    message: NonBlank

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        if extra := _unknown(errors):
            return f"unknown field(s) {extra}; the body is {{'message': str}}"
        value = data.get("message")
        if value is None:
            return "the field 'message' is missing"
        if not isinstance(value, str):
            return f"'message' must be a string, got {json_type(value)}"
        return "'message' is empty"


class ResumeBody(Body):
    """POST .../resume: no body, or `{}`."""

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        return f"resume takes no fields; got {sorted(data)[:10]}"


class ApprovalBody(Body):
    """POST .../approvals/{tool_call_id}: a person's decision on one call."""

    SHAPE: ClassVar[str] = (
        "the body is {'approved': true|false, 'digest': '<64 hex>', 'reason'?: str, "
        "'arguments'?: {...} (with an approval: the approver's edit)}"
    )
    _WORDS: ClassVar[dict[str, str]] = {
        "approved": "'approved' must be true or false",
        "digest": "'digest' must be 64 lower-case hex",
        "reason": "'reason' must be a string",
        "arguments": "'arguments' must be a JSON object",
        "": "'arguments' go with an approval only (a denial runs nothing)",
    }

    approved: StrictBool
    digest: Annotated[StrictStr, matching(DIGEST, "digest")]
    reason: StrictStr | None = None
    arguments: dict[str, Any] | None = None  # an approval's edit of the call's arguments

    @model_validator(mode="after")
    def _edit_only_with_approval(self) -> ApprovalBody:
        if self.arguments is not None and not self.approved:
            raise PydanticCustomError("edited-denial", "arguments go with an approval only")
        return self

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        if extra := _unknown(errors):
            return f"unknown field(s) {extra}; {cls.SHAPE}"
        field, _ = _first_field(errors)
        return f"{cls._WORDS[field]}; {cls.SHAPE}"


class ScheduleBody(Body):
    """POST .../schedules: a message, and when: once (`delay_seconds` or `at`) or on a
    rhythm (`cron` with an optional `timezone`, or `every_seconds`, optionally from `at`).
    The time and the rule are checked by `schedules.when` (it needs a clock), not here."""

    message: NonBlank
    delay_seconds: Any = None
    at: Any = None
    cron: Any = None
    timezone: Any = None
    every_seconds: Any = None

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        if extra := _unknown(errors):
            return (
                f"unknown field(s) {extra}; the body is {{'message': str, 'delay_seconds': "
                "number}, {'message': str, 'at': ISO 8601 time}, {'message': str, 'cron': "
                "str, 'timezone': IANA name} or {'message': str, 'every_seconds': int}"
            )
        return "'message' must be a non-empty string"


class TokenBody(Body):
    """POST .../token: none, or `{"ttl_seconds": N}`."""

    ttl_seconds: Annotated[StrictInt, Field(ge=1, le=MAX_TOKEN_TTL_S)] = DEFAULT_TOKEN_TTL_S

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        return (
            f"the body is {{}} or {{'ttl_seconds': 1 to {MAX_TOKEN_TTL_S}}} (default "
            f"{DEFAULT_TOKEN_TTL_S})"
        )


def body_of(model: type[BodyT], data: Mapping[str, Any]) -> BodyT | Reply:
    """`data` as a `model`, or the 422 `invalid-body` that says what is wrong with it."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return error_reply(422, "invalid-body", model.explain(exc.errors(), data))


async def read_json(
    headers: Mapping[str, str], body: bytes | BodyReader, limit: int, *, required: bool
) -> dict[str, Any] | Reply:
    """The request's JSON object, read only once its declared size is within `limit`;
    or the 4xx that says why not (an empty body is `{}` unless `required`)."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            declared_size = int(declared)
        except ValueError:
            return error_reply(400, "invalid-request", "Content-Length is not a number")
        if declared_size > limit:
            return _too_large(limit)
    raw = body if isinstance(body, bytes) else await body()
    if len(raw) > limit:
        return _too_large(limit)
    if not raw.strip():
        if required:
            return error_reply(400, "invalid-json", 'the body is empty; send {"message": "..."}')
        return {}
    try:
        data = _json.loads(raw.decode("utf-8"))
    except _json.JSONTooDeepError:
        return error_reply(
            400,
            "invalid-json",
            f"the body nests arrays and objects deeper than {_json.MAX_DEPTH} levels; "
            'send {"message": "..."}',
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return error_reply(400, "invalid-json", f"the body is not valid JSON: {exc}"[:300])
    if not isinstance(data, dict):
        return error_reply(
            422, "invalid-body", f"the body must be a JSON object, got {json_type(data)}"
        )
    return data


def _too_large(limit: int) -> Reply:
    return error_reply(413, "body-too-large", f"the body is over {limit:,} bytes (MAX_BODY_BYTES)")
