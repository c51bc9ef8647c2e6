"""Typed answers: `Agent(output_type=...)`.

The model gives its answer by calling the tool `final_result`, whose input
schema is the output type's (a type whose schema is not an object, `int` or
`list[str]`, is wrapped as `{"result": ...}`). The run loop answers that call
like any other: an invalid answer gets an `invalid-arguments` result listing
the validation errors, and the model tries again, at most
`Agent.max_output_retries` times a turn; a valid one ends the turn, and the
turn's final message stores it as JSON (`RunResult.output` is it, validated).
A model that answers in text instead has that text read as JSON (a
```json fence is allowed); text that is not a valid answer is sent back
with the errors, unstored, under the same bound.

`final_result` has no side effect, so a crash before its result is stored is
repaired by validating the stored call again. What a run keeps while the model
tries is `_turn.output_retries`; the guide is docs/turns.md (A typed answer).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import ConfigurationError
from .messages import ToolSpec
from .tools import validation_summary

__all__ = ["OutputSchema"]

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)


class OutputSchema:
    """An output type, as the model is asked for it and as its answers are checked."""

    def __init__(self, output_type: Any, tool_name: str) -> None:
        try:
            self.adapter: TypeAdapter[Any] = TypeAdapter(output_type)
            schema = self.adapter.json_schema()
        except Exception as exc:
            raise ConfigurationError(
                f"output_type {output_type!r} is not a type pydantic can validate and describe "
                f"in JSON schema: {exc}"
            ) from None
        self.wrapped = schema.get("type") != "object"
        if self.wrapped:
            defs = schema.pop("$defs", None)
            schema = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
            if defs:
                schema["$defs"] = defs  # "#/$defs/..." references still resolve at the top
        doc = output_type.__doc__ if isinstance(output_type, type) else None
        if isinstance(output_type, type) and issubclass(output_type, BaseModel):
            doc = output_type.__doc__ if output_type.__doc__ != BaseModel.__doc__ else None
        described = f" It is: {doc.strip()}" if doc and doc.strip() else ""
        self.spec = ToolSpec(
            tool_name,
            "Give your final answer by calling this tool once, on its own, with the answer as "
            f"its arguments; the turn ends when it is accepted.{described}",
            schema,
        )

    def validate(self, arguments: dict[str, Any]) -> Any:
        """The answer a `final_result` call gives. ValueError listing the problems."""
        try:
            if self.wrapped:
                if "result" not in arguments:
                    raise ValueError("result: required")
                return self.adapter.validate_python(arguments["result"])
            return self.adapter.validate_python(arguments)
        except ValidationError as exc:
            raise ValueError(validation_summary(exc)) from None

    def from_text(self, text: str) -> Any:
        """The answer a text reply gives, read as JSON. ValueError saying why not."""
        fenced = _FENCE.match(text)
        body = fenced.group(1) if fenced else text
        try:
            data = json.loads(body)
        except ValueError:
            raise ValueError("the reply is not JSON") from None
        if isinstance(data, dict):
            return self.validate(data)
        if self.wrapped:
            return self.validate({"result": data})
        raise ValueError(f"the reply is JSON {type(data).__name__}, not an object")

    def dump(self, value: Any) -> str:
        """The stored form of an answer: JSON."""
        return self.adapter.dump_json(value).decode()

    def load(self, text: str) -> Any:
        """A stored answer, validated again. ValueError if it is not one."""
        try:
            return self.adapter.validate_json(text)
        except ValidationError as exc:
            raise ValueError(validation_summary(exc)) from None
