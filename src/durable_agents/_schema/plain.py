"""A tool's arguments checked at once against the commonest input schema.

Why: every tool call's arguments are checked against its tool's schema before the
handler runs (`Tool.parse_arguments`), and the general check (`check.schema_problems`)
walks the schema keyword by keyword, on every call. Most schemas a tool declares are
one flat object: `properties` each with a `type` (and words for the model), maybe
`required` and `additionalProperties: false`. For such a schema `plain_check` builds,
once per tool, a check that only says whether a value fits: True exactly when
`schema_problems` would find nothing. When it says False, or the schema is of any
other shape (None: no plain check), the general check runs and says what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .check import json_type

__all__ = ["plain_check"]

_WORDS = frozenset(("description", "title"))  # what no check reads
_PROPERTY_KEYS = _WORDS | {"type"}
_OBJECT_KEYS = _WORDS | {"type", "properties", "required", "additionalProperties"}
_TYPES = frozenset(("string", "number", "integer", "boolean", "null", "array", "object"))
_ANY: str | None = None  # a property with no `type`: any value fits it


def _property_types(properties: Any) -> dict[str, str | None] | None:
    """Each property's type (`_ANY` for none), or None if one says more than a type."""
    if not isinstance(properties, dict):
        return None
    types: dict[str, str | None] = {}
    for name, schema in properties.items():
        if type(schema) is not dict or not _PROPERTY_KEYS.issuperset(schema):
            return None
        kind = schema.get("type", _ANY)
        if kind is not _ANY and not (isinstance(kind, str) and kind in _TYPES):
            return None
        types[name] = kind
    return types


def plain_check(schema: Any) -> Callable[[dict[str, Any]], bool] | None:
    """For a flat object schema (see the module), whether a dict fits it; else None."""
    if type(schema) is not dict or not _OBJECT_KEYS.issuperset(schema):
        return None
    types = _property_types(schema.get("properties", {}))
    required = schema.get("required", [])
    closed = schema.get("additionalProperties", True)
    if (
        schema.get("type", "object") != "object"
        or types is None
        or type(required) is not list
        or not all(type(name) is str for name in required)
        or (closed is not True and closed is not False)
    ):
        return None
    closed = closed is False

    def fits(value: dict[str, Any]) -> bool:
        for name in required:
            if name not in value:
                return False
        for key, item in value.items():
            if type(key) is not str:
                return False  # (the general check says what it makes of it)
            if key not in types:
                if closed:
                    return False
                continue
            kind = types[key]
            if kind is not _ANY:
                actual = json_type(item)
                if actual != kind and not (kind == "number" and actual == "integer"):
                    return False
        return True

    return fits
