"""The kit's one JSON Schema check: where a value breaks a schema (`schema_problems`),
and the JSON type of a value (`json_type`).

Used by `Tool.parse_arguments` for a tool without a pydantic model (an MCP tool,
a hand-written schema; see docs/mcp.md) and by the value generator, which checks
every value it makes (`values.py`; docs/testing.md). It reads the keywords
pydantic writes and hand-written schemas use: `$ref`, `const`, `enum`, `type`,
`allOf`/`anyOf`/`oneOf`/`not`, and each type's own (lengths, `pattern`, bounds,
`multipleOf`, items, properties, `required`, `additionalProperties`, ...).
`format` and `contentSchema` are annotations in JSON Schema 2020-12: held only
when asked (`annotations=True`). A `$ref` that points nowhere constrains nothing.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "MAX_REF_CHAIN",
    "Problem",
    "SchemaRefError",
    "bound",
    "canonical",
    "describe_bounds",
    "item_schemas",
    "json_type",
    "key_path",
    "resolve",
    "same_json",
    "schema_problems",
]

MAX_REF_CHAIN = 32
"""The most `$ref`s followed one after another (a longer chain is taken for a loop)."""

_MAX_CHECK_DEPTH = 64
_ABSENT: Any = object()
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMBINING = frozenset(("allOf", "anyOf", "oneOf", "not"))  # combined_problems' keywords


class Problem(NamedTuple):
    """Where a value breaks its schema (`path`, e.g. `$.slot.date`), why, and the value
    found there (absent for a missing property)."""

    path: str
    why: str
    value: Any = _ABSENT

    @property
    def has_value(self) -> bool:
        return self.value is not _ABSENT


class SchemaRefError(Exception):
    """A `$ref` that cannot be followed: `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def json_type(value: Any) -> str:
    """The JSON Schema type of a Python value read from JSON.

    A float with no fractional part (`1.0`) is an "integer", as JSON Schema
    counts it (every "integer" is also a "number"); `True` is a "boolean", never
    an integer. A value JSON cannot hold gets its Python type's name.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: 1 and True differ, 1 and 1.0 do not."""
    if json_type(a) != json_type(b):
        return False
    return bool(json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or a == b)


@functools.lru_cache(maxsize=1024)  # (every key of every checked object: the same few)
def key_path(path: str, key: str) -> str:
    """The path of property `key` under `path`: `$.name`, or `$['odd key']`."""
    return f"{path}.{key}" if _IDENTIFIER.fullmatch(key) else f"{path}[{key!r}]"


def resolve(root: Any, schema: Any) -> Any:
    """`schema` with its `$ref`s (into `root`) followed, their siblings kept (as JSON
    Schema 2019 does). Raises `SchemaRefError` for one that points nowhere or outside."""
    if type(schema) is dict and "$ref" not in schema:
        return schema  # (most schemas: no look at what a Mapping is)
    seen = 0
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        seen += 1
        if seen > MAX_REF_CHAIN:
            raise SchemaRefError("its $ref chain does not end")
        target = _ref_target(root, schema["$ref"])
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **siblings} if isinstance(target, Mapping) else target
    return schema


def _ref_target(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        raise SchemaRefError(f"its $ref {ref!r} points outside the schema")
    target = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, Mapping) or part not in target:
            raise SchemaRefError(f"its $ref {ref!r} points nowhere in the schema")
        target = target[part]
    return target


def bound(
    schema: Mapping[str, Any], closed: str, open_: str, tighter: Callable[[float, float], float]
) -> tuple[float | None, bool]:
    """One side's bound and whether it is exclusive (the tighter of the two keywords)."""
    inclusive, exclusive = schema.get(closed), schema.get(open_)
    if isinstance(exclusive, bool):  # draft 4: a flag on the inclusive one
        return inclusive, exclusive and inclusive is not None
    if exclusive is None:
        return inclusive, False
    if inclusive is None or tighter(inclusive, exclusive) == exclusive:
        return exclusive, True
    return inclusive, False


def describe_bounds(schema: Mapping[str, Any]) -> str:
    """A number schema's bounds as words: "minimum 1, maximum 9"."""
    keys = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf")
    return ", ".join(f"{k} {schema[k]}" for k in keys if k in schema)


def schema_problems(
    value: Any,
    schema: Any,
    path: str = "$",
    *,
    root: Any = None,
    annotations: bool = False,
) -> list[Problem]:
    """Where `value` breaks `schema` (see the module docstring); [] when it fits.

    `root` is the document `$ref`s point into (default: `schema`); `path` names
    the value in each problem. `annotations=True` also holds `format` and
    `contentSchema`.
    """
    checker = _Checker(schema if root is None else root, annotations)
    return checker.problems(value, schema, path, 0)


_Bad = Callable[[str], list[Problem]]


class _Checker:
    def __init__(self, root: Any, annotations: bool) -> None:
        self.root = root
        self.annotations = annotations

    def problems(self, value: Any, schema: Any, path: str, depth: int) -> list[Problem]:
        if depth > _MAX_CHECK_DEPTH:
            return []
        try:
            schema = resolve(self.root, schema)
        except SchemaRefError:
            return []
        if type(schema) is not dict and (schema is True or not isinstance(schema, Mapping)):
            return [] if schema is not False else [Problem(path, "its schema allows no value")]

        def bad(why: str) -> list[Problem]:
            return [Problem(path, why, value)]

        wrong_kind = _kind_problems(value, schema, bad)
        if wrong_kind:
            return wrong_kind
        found = (
            []
            if _COMBINING.isdisjoint(schema)
            else self.combined_problems(value, schema, path, depth, bad)
        )
        if isinstance(value, str):
            found += self.string_problems(value, schema, path, depth, bad)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found += _number_problems(value, schema, bad)
        elif isinstance(value, list):
            found += self.array_problems(value, schema, path, depth, bad)
        elif isinstance(value, dict):
            found += self.object_problems(value, schema, path, depth)
        return found

    def fits(self, value: Any, schema: Any, path: str, depth: int) -> bool:
        return not self.problems(value, schema, path, depth + 1)

    def combined_problems(
        self, value: Any, schema: Mapping[str, Any], path: str, depth: int, bad: _Bad
    ) -> list[Problem]:
        """What `allOf`, `anyOf`, `oneOf` and `not` find."""
        found: list[Problem] = []
        for sub in schema.get("allOf") or ():
            found += self.problems(value, sub, path, depth + 1)
        options = schema.get("anyOf")
        if isinstance(options, list) and not any(self.fits(value, s, path, depth) for s in options):
            found += bad("fits none of its anyOf options")
        if isinstance(schema.get("oneOf"), list) and schema["oneOf"]:
            fits = sum(1 for s in schema["oneOf"] if self.fits(value, s, path, depth))
            if fits != 1:
                found += bad(f"must fit exactly one of its oneOf options, and fits {fits}")
        if "not" in schema and self.fits(value, schema["not"], path, depth):
            found += bad("fits the schema under `not`")
        return found

    def string_problems(
        self, value: str, schema: Mapping[str, Any], path: str, depth: int, bad: _Bad
    ) -> list[Problem]:
        found = []
        if len(value) < int(schema.get("minLength", 0)):
            found += bad(f"must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > int(schema["maxLength"]):
            found += bad(f"must have at most {schema['maxLength']} characters")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            from .regex_sample import pattern_search  # loaded for the first pattern only

            search = pattern_search(pattern)
            if search is not None and not search(value):
                found += bad(f"must match the pattern '{pattern}'")
        if self.annotations:
            found += self.annotation_problems(value, schema, path, depth, bad)
        return found

    def annotation_problems(
        self, value: str, schema: Mapping[str, Any], path: str, depth: int, bad: _Bad
    ) -> list[Problem]:
        """What `format` and `contentSchema` find (JSON inside a string, pydantic's Json)."""
        found = []
        form = schema.get("format")
        if isinstance(form, str):
            from .formats import format_fits  # loaded for the first format only

            if not format_fits(form, value):
                found += bad(f"must be a valid {form}")
        content = schema.get("contentSchema")
        if isinstance(content, (Mapping, bool)):
            try:
                found += self.problems(json.loads(value), content, path, depth + 1)
            except ValueError:
                found += bad("must be JSON")
        return found

    def array_problems(
        self, value: list[Any], schema: Mapping[str, Any], path: str, depth: int, bad: _Bad
    ) -> list[Problem]:
        found = []
        if len(value) < int(schema.get("minItems", 0)):
            found += bad(f"must have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > int(schema["maxItems"]):
            found += bad(f"must have at most {schema['maxItems']} items")
        if schema.get("uniqueItems") and len({canonical(v) for v in value}) < len(value):
            found += bad("its items must all differ")
        prefix, rest = item_schemas(schema)
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else rest
            if sub is not None:
                found += self.problems(item, sub, f"{path}[{i}]", depth + 1)
        return found

    def object_problems(
        self, value: dict[str, Any], schema: Mapping[str, Any], path: str, depth: int
    ) -> list[Problem]:
        found = []
        properties: Mapping[str, Any] = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                found.append(Problem(key_path(path, str(name)), "required"))
        extra = schema.get("additionalProperties", True)
        names = schema.get("propertyNames")
        for key, item in value.items():
            where = key_path(path, key)
            if key in properties:
                found += self.problems(item, properties[key], where, depth + 1)
            elif extra is False:
                found.append(Problem(where, "not allowed"))
            elif isinstance(extra, Mapping):
                found += self.problems(item, extra, where, depth + 1)
            if names is not None:
                found += self.problems(key, names, f"{where} (its name)", depth + 1)
        if len(value) < int(schema.get("minProperties", 0)):
            found.append(
                Problem(path, f"must have at least {schema['minProperties']} properties", value)
            )
        return found


def _kind_problems(value: Any, schema: Mapping[str, Any], bad: _Bad) -> list[Problem]:
    """The value's type, `const` and `enum`: what rules it out at once."""
    kinds = schema.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        actual = json_type(value)
        if actual not in names and not (actual == "integer" and "number" in names):
            return bad(f"expected {' or '.join(map(str, names))}, got {actual}")
    if "const" in schema and not same_json(value, schema["const"]):
        return bad(f"must be {schema['const']!r}")
    if isinstance(schema.get("enum"), list) and not any(
        same_json(value, e) for e in schema["enum"]
    ):
        return bad(f"must be one of {schema['enum']!r}")
    return []


def _number_problems(value: float, schema: Mapping[str, Any], bad: _Bad) -> list[Problem]:
    low, low_open = bound(schema, "minimum", "exclusiveMinimum", max)
    high, high_open = bound(schema, "maximum", "exclusiveMaximum", min)
    if (low is not None and (value < low or (low_open and value == low))) or (
        high is not None and (value > high or (high_open and value == high))
    ):
        return bad(f"must lie within {describe_bounds(schema)}")
    step = schema.get("multipleOf")
    if step:
        ratio = value / step
        if abs(ratio - round(ratio)) > 1e-9 * max(1.0, abs(ratio)):
            return bad(f"must be a multiple of {step}")
    return []


def item_schemas(schema: Mapping[str, Any]) -> tuple[list[Any], Any]:
    """An array schema's item schemas: those of the first items (`prefixItems`, or
    draft 4's list under `items`), and that of every item after them (None: any)."""
    items = schema.get("items")
    prefix = schema.get("prefixItems") or (items if isinstance(items, list) else [])
    rest = items if isinstance(items, (Mapping, bool)) else schema.get("additionalItems")
    return list(prefix), rest


def canonical(value: Any) -> str:
    """A value as a key that equal JSON values share (for `uniqueItems`)."""
    return json.dumps(value, sort_keys=True, default=str)
