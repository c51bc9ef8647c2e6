"""Example values for a JSON schema: the arguments `TestLLM` makes for a tool.

    example_arguments(tool.input_schema, tool_name="book_slot",
                      validate=Booking.model_validate)      # {"date": "1111-11-11", ...}

Follows what pydantic writes for a model and what hand-written schemas say
(the keywords are listed in docs/testing.md); a `pattern` gets an example
string of its own (`regex_sample.py`), a `format` a valid value (`formats.py`).
An optional property that cannot be filled is left out (the model's default
applies); a required one cannot be.

`steers` (the caller's `values=`, made by `formats.steered_formats`) give a format
the caller's values instead: `{"date-time": "future"}` (relative to `now`),
`{"email": "reader@example.org"}`; a steered value must fit the schema too.

Every value is checked against the schema it was made for (`check.py`, formats
included), then, given `validate` (the tool's pydantic model), against the
model. What cannot be made valid raises `ConfigurationError` naming the tool,
each field by its JSON path (`$.slot.date`) and why, and the `arguments=` to
pass by hand. Deterministic: the same schema (and steers, at the same `now`) always
gives the same arguments.
Core, not the testing kit: `TestLLM` is also the Worker's offline "demo" model.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigurationError
from .check import (
    Problem,
    SchemaRefError,
    bound,
    canonical,
    describe_bounds,
    key_path,
    resolve,
    schema_problems,
)
from .formats import FORMATS, PRESETS, Steer, format_fits
from .regex_sample import PatternNotSampled, pattern_search, sample_pattern

__all__ = ["example_arguments", "variant_arguments"]

_MAX_DEPTH = 32
_TEMPLATE_CHARS = 600


class _Hole:
    """Where a value could not be made, in the arguments template of the error."""

    def __repr__(self) -> str:
        return "..."


_HOLE = _Hole()


class _Unfillable(Exception):
    """What could not be filled: (JSON path, why) pairs, and what was made around them."""

    def __init__(self, problems: list[tuple[str, str]], partial: Any = _HOLE) -> None:
        super().__init__(problems)
        self.problems = problems
        self.partial = partial


def _cannot(path: str, why: str) -> _Unfillable:
    return _Unfillable([(path, why)])


class _NoVariant(Exception):
    """The schema has fewer distinct values than asked for (for `uniqueItems`)."""


_TYPE_KEYWORDS = (
    (
        "object",
        ("properties", "additionalProperties", "required", "minProperties", "propertyNames"),
    ),
    ("array", ("items", "prefixItems", "minItems", "maxItems", "uniqueItems")),
    ("string", ("minLength", "maxLength", "pattern", "format", "contentSchema")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")),
)


def _kind(schema: Mapping[str, Any]) -> str:
    """The JSON type to make: the schema's (the first but null, of a list), else the one
    its keywords belong to, else an object (an empty schema takes anything)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    for name, keywords in _TYPE_KEYWORDS:
        if any(k in schema for k in keywords):
            return name
    return "object"


def _only(value: Any, variant: int) -> Any:
    """A schema's one value (`const`, `null`): no other variant."""
    if variant:
        raise _NoVariant
    return copy.deepcopy(value)


# -- making values ----------------------------------------------------------------------


class _Maker:
    def __init__(
        self,
        root: Mapping[str, Any],
        steers: Mapping[str, Steer] | None = None,
        now: datetime.datetime | None = None,
    ) -> None:
        self.root = root
        self.steers = steers or {}
        self.now = now if now is not None else _now(self.steers)

    def resolve(self, schema: Any, path: str) -> Any:
        """`schema` with its `$ref`s followed; `_Unfillable` for one that cannot be."""
        try:
            return resolve(self.root, schema)
        except SchemaRefError as exc:
            raise _cannot(path, exc.reason) from None

    def problems(self, value: Any, schema: Any, path: str) -> list[tuple[str, str]]:
        """Where `value` breaks `schema` (formats held too), each with the value made."""
        found = schema_problems(value, schema, path, root=self.root, annotations=True)
        return [(p.path, _said(p)) for p in found]

    def value(self, schema: Any, path: str, variant: int = 0, depth: int = 0) -> Any:
        """A value `schema` allows; `variant=k` the k-th other one (`_NoVariant` if none)."""
        if depth > _MAX_DEPTH:
            raise _cannot(
                path,
                f"the schema nests itself more than {_MAX_DEPTH} levels deep here (a "
                "recursive model with a required field of its own type?)",
            )
        schema = self.resolve(schema, path)
        if not isinstance(schema, Mapping) or not schema:
            return _anything_or_nothing(schema, path, variant)
        if "const" in schema:
            return _only(schema["const"], variant)
        if variant == 0 and not self.steered(schema) and self.default_fits(schema, path):
            return copy.deepcopy(schema["default"])
        if isinstance(schema.get("enum"), list):
            return self.enum(schema, path, variant)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.union(schema, key, path, variant, depth)
        if isinstance(schema.get("allOf"), list) and schema["allOf"]:
            return self.all_of(schema, path, variant, depth)
        return self.typed(schema, path, variant, depth)

    def steered(self, schema: Mapping[str, Any]) -> bool:
        """Whether `values=` steers the schema's format (its values then win over a
        `default`)."""
        form = schema.get("format")
        return isinstance(form, str) and form in self.steers

    def steered_string(self, schema: Mapping[str, Any], form: str, path: str, variant: int) -> str:
        """The value `values=` gives the format `form`, checked against the whole schema."""
        try:
            made = self.steers[form](self.now, variant)
        except Exception as exc:  # the caller's function, or what it returned
            raise _cannot(
                path, f"values= for the format {form!r} raised {type(exc).__name__}: {exc}"
            ) from None
        if made is None:
            raise _NoVariant
        found = self.problems(made, schema, path)
        if found:
            hint = (
                f" (its presets: {', '.join(map(repr, PRESETS))})"
                if form in ("date", "date-time")
                else ""
            )
            why = "; ".join(why for _, why in found)
            raise _cannot(
                path, f"the value values= gives the format {form!r} breaks its schema{hint}: {why}"
            )
        return str(made)

    def default_fits(self, schema: Mapping[str, Any], path: str) -> bool:
        """Whether the schema has a `default` that fits it (pydantic does not check one)."""
        return "default" in schema and not self.problems(schema["default"], schema, path)

    def typed(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> Any:
        """A value of the schema's type (`_kind`), made by that type's maker."""
        kind = _kind(schema)
        makers = {"object": self.object, "array": self.array, "string": self.string}
        if kind in makers:
            return makers[kind](schema, path, variant, depth)
        if kind in ("integer", "number"):
            return self.number(schema, path, variant, integer=kind == "integer")
        if kind == "boolean":
            if variant > 1:
                raise _NoVariant
            return variant == 1
        if kind == "null":
            return _only(None, variant)
        raise _cannot(path, f"its type {kind!r} is not a JSON type")

    def all_of(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> Any:
        value = self.value(self.merge(schema, path), path, variant, depth + 1)
        found = self.problems(value, schema, path)
        if found:
            raise _Unfillable(found, value)
        return value

    def enum(self, schema: Mapping[str, Any], path: str, variant: int) -> Any:
        rest = {k: v for k, v in schema.items() if k not in ("enum", "default")}
        fitting = [e for e in schema["enum"] if not self.problems(e, rest, path)]
        if not fitting:
            raise _cannot(
                path,
                f"none of its enum values {schema['enum']!r} fits the rest of its schema",
            )
        if variant >= len(fitting):
            raise _NoVariant
        return copy.deepcopy(fitting[variant])

    def union(
        self, schema: Mapping[str, Any], key: str, path: str, variant: int, depth: int
    ) -> Any:
        """The first option (null last) whose value fits the whole schema."""
        options = [self.resolve(o, path) for o in schema[key]]
        nulls = [o for o in options if isinstance(o, Mapping) and o.get("type") == "null"]
        ordered = [o for o in options if not any(o is n for n in nulls)] + nulls
        rest = {k: v for k, v in schema.items() if k not in (key, "default")}
        failures: list[str] = []
        short_of_variants = False
        for number, option in enumerate(ordered, 1):
            merged = {**rest, **option} if isinstance(option, Mapping) else option
            try:
                value = self.value(merged, path, variant, depth + 1)
            except _NoVariant:
                short_of_variants = True
                continue
            except _Unfillable as exc:
                failures.append(f"option {number}: " + "; ".join(why for _, why in exc.problems))
                continue
            found = self.problems(value, schema, path)
            if not found:
                return value
            failures.append(f"option {number}: " + "; ".join(why for _, why in found))
        if short_of_variants and variant:
            raise _NoVariant
        raise _cannot(path, f"none of its {key} options can be filled ({'; '.join(failures)})")

    def merge(self, schema: Mapping[str, Any], path: str) -> dict[str, Any]:
        """The `allOf` parts (and the schema around them) as one schema to make a value
        from: properties merged, `required` joined, bounds the tighter."""
        parts = [{k: v for k, v in schema.items() if k != "allOf"}]
        parts += [self.resolve(p, path) for p in schema["allOf"]]
        merged: dict[str, Any] = {}
        tighter = {
            **dict.fromkeys(("minimum", "exclusiveMinimum", "minLength", "minItems"), max),
            **dict.fromkeys(("maximum", "exclusiveMaximum", "maxLength", "maxItems"), min),
        }
        for part in parts:
            if not isinstance(part, Mapping):
                continue
            for key, value in part.items():
                if key == "properties" and key in merged:
                    properties = dict(merged[key])
                    for name, sub in value.items():
                        both = {"allOf": [properties[name], sub]} if name in properties else sub
                        properties[name] = both
                    merged[key] = properties
                elif key == "required" and key in merged:
                    merged[key] = [*merged[key], *(r for r in value if r not in merged[key])]
                elif key in tighter and key in merged:
                    merged[key] = tighter[key](merged[key], value)
                elif key == "allOf":
                    merged.setdefault("allOf", []).extend(value)
                else:
                    merged[key] = value
        if "allOf" in merged:  # nested allOf: one level at a time
            return self.merge(merged, path)
        return merged

    def object(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> Any:
        """Its properties (each made; an optional one left out if it cannot be), then more
        up to `minProperties`."""
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = [r for r in schema.get("required") or () if isinstance(r, str)]
        extra = schema.get("additionalProperties", True)
        extra_schema = extra if isinstance(extra, Mapping) else {}
        result: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        for name in [*properties, *(r for r in required if r not in properties)]:
            sub = properties.get(name, extra_schema)
            where = key_path(path, name)
            try:
                result[name] = self.property_value(sub, where, variant, depth)
            except _Unfillable as exc:
                if name in required:
                    problems += exc.problems
                    result[name] = exc.partial
        if problems:
            raise _Unfillable(problems, result)
        wanted = int(schema.get("minProperties", 0))
        if len(result) < wanted:
            if extra is False:
                raise _cannot(
                    path,
                    f"it needs {wanted} properties (minProperties) but allows only "
                    f"{len(properties)}",
                )
            self.add_properties(schema, result, wanted, path, depth)
        return result

    def property_value(self, schema: Any, path: str, variant: int, depth: int) -> Any:
        """A property's value: its `variant`, or its first value where it has no other."""
        try:
            return self.value(schema, path, variant, depth + 1)
        except _NoVariant:
            return self.value(schema, path, 0, depth + 1)

    def add_properties(
        self, schema: Mapping[str, Any], result: dict[str, Any], wanted: int, path: str, depth: int
    ) -> None:
        """Properties of names `propertyNames` allows, added to `result` until it has
        `wanted` (`minProperties`)."""
        extra = schema.get("additionalProperties", True)
        extra_schema = extra if isinstance(extra, Mapping) else {}
        names_schema = schema.get("propertyNames") or {"type": "string"}
        for k in range(wanted * 4 + 26):
            if len(result) >= wanted:
                break
            try:
                key = self.value(names_schema, f"{path} (a property name)", k, depth + 1)
            except _NoVariant:
                break
            if isinstance(key, str) and key not in result:
                result[key] = self.value(extra_schema, key_path(path, key), 0, depth + 1)
        if len(result) < wanted:
            raise _cannot(
                path,
                f"it needs {wanted} properties (minProperties); only {len(result)} "
                "distinct property names were found",
            )

    def array(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> Any:
        """`minItems` items (at least the `prefixItems`); with `uniqueItems`, each another
        variant of its schema."""
        prefix, item = _item_schemas(schema)
        low = _item_count(schema, len(prefix), path)
        unique = bool(schema.get("uniqueItems"))
        if variant and low == 0:
            raise _NoVariant
        values: list[Any] = []
        problems: list[tuple[str, str]] = []
        for i in range(low):
            sub = prefix[i] if i < len(prefix) else item
            wanted = (i + variant * low) if unique else (variant if i == 0 else 0)
            try:
                values.append(self.value(sub, f"{path}[{i}]", wanted, depth + 1))
            except _NoVariant:
                if not unique or i < len(prefix):
                    raise
                raise _cannot(
                    path,
                    f"its {low} items must all differ (uniqueItems), and its item schema "
                    f"allows only {i} different values",
                ) from None
            except _Unfillable as exc:
                problems += exc.problems
                values.append(exc.partial)
        if problems:
            raise _Unfillable(problems, values)
        if unique and len({canonical(v) for v in values}) < len(values):
            raise _cannot(path, "its items must all differ (uniqueItems), and the ones made do not")
        return values

    def string(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> str:
        """A string of its pattern, else of its format, else letters, within its lengths."""
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        high = None if high is None else int(high)
        if high is not None and low > high:
            raise _cannot(path, f"its minLength {low} is over its maxLength {high}")
        content = schema.get("contentSchema")
        if isinstance(content, (Mapping, bool)):  # JSON inside a string (pydantic's Json)
            return json.dumps(self.value(content, f"{path} (its JSON content)", variant, depth + 1))
        form = schema.get("format")
        if isinstance(form, str) and form in self.steers:
            return self.steered_string(schema, form, path, variant)
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            return _patterned(pattern, form, low, high, path, variant)
        if isinstance(form, str) and form in FORMATS:
            text = FORMATS[form](variant)
            if low <= len(text) and (high is None or len(text) <= high):
                return text
            raise _cannot(
                path,
                f"a {form} such as {text!r} has {len(text)} characters, outside its "
                "minLength/maxLength",
            )
        length = max(1, low) if high is None else min(max(1, low), high)
        return _counted(length, variant)

    def number(
        self, schema: Mapping[str, Any], path: str, variant: int, *, integer: bool
    ) -> int | float:
        """The smallest value the bounds allow (or one inside them), else 1; a multiple
        of `multipleOf` when given. Variants: a step (or 1) further each, or, between two
        bounds of a float, a point further along the room between them."""
        low, low_open = bound(schema, "minimum", "exclusiveMinimum", max)
        high, high_open = bound(schema, "maximum", "exclusiveMaximum", min)
        step = schema.get("multipleOf")
        if not integer and not step and low is not None and high is not None:
            return _between(low, low_open, high, variant)
        first = (
            _first_integer(low, low_open, high, high_open)
            if integer
            else _first_number(low, low_open, high, high_open)
        )
        if first is None or _no_room(low, low_open, high, high_open):
            what = "integer" if integer else "number"
            raise _cannot(path, f"no {what} lies within its bounds ({describe_bounds(schema)})")
        value: float = first
        if step:
            value = _on_step(value, step, low, low_open)
            if integer and not float(value).is_integer():
                raise _cannot(path, f"its multipleOf {step} allows no integer")
        value += variant * (step or 1)
        if high is not None and (value > high or (high_open and value >= high)):
            if variant:
                raise _NoVariant
            raise _cannot(
                path,
                f"no multiple of {step} lies within its bounds ({describe_bounds(schema)})",
            )
        return int(value) if integer else float(value)


def _patterned(pattern: str, form: Any, low: int, high: int | None, path: str, variant: int) -> str:
    """A string of `pattern` within the lengths (and of the format `form`, if it is one)."""
    try:
        text = sample_pattern(pattern, min_length=low, max_length=high, variant=variant)
    except PatternNotSampled as exc:
        raise _Unfillable([(path, f"its pattern '{pattern}': {exc.reason}")]) from None
    if text is None:
        raise _NoVariant
    if isinstance(form, str) and not format_fits(form, text):
        made = FORMATS[form](variant) if form in FORMATS else None
        search = pattern_search(pattern)
        if made is not None and (search is None or search(made)):
            return made
        raise _cannot(
            path,
            f"its pattern '{pattern}' gives {text!r}, which is not a valid {form}",
        )
    return text


def _anything_or_nothing(schema: Any, path: str, variant: int) -> Any:
    """The value of a schema that is not a non-empty object: `true` and `{}` allow
    anything (an empty object is made), `false` nothing."""
    if schema is True or schema == {}:
        return _only({}, variant)
    if schema is False:
        raise _cannot(path, "its schema is `false`: no value is allowed")
    raise _cannot(path, f"its schema is not an object: {schema!r}")


def _said(problem: Problem) -> str:
    """A check's problem as the generator says it: with the value it made."""
    if not problem.has_value:
        return problem.why
    return f"{problem.why} (the value made: {_short(problem.value)})"


def _item_schemas(schema: Mapping[str, Any]) -> tuple[Sequence[Any], Any]:
    """The schemas of an array's first items (`prefixItems`, or draft 4's tuple) and of
    the items after them (anything, if it names none)."""
    items = schema.get("items")
    tuple_items = items if isinstance(items, list) else []  # draft 4's tuples
    prefix: Sequence[Any] = schema.get("prefixItems") or tuple_items
    if isinstance(items, (Mapping, bool)):
        return prefix, items
    additional = schema.get("additionalItems")
    return prefix, additional if isinstance(additional, Mapping) else {}


def _item_count(schema: Mapping[str, Any], prefix: int, path: str) -> int:
    """How many items to make: `minItems`, and at least one per prefix item."""
    low = max(prefix, int(schema.get("minItems", 0)))
    high = schema.get("maxItems")
    if high is not None and low > int(high):
        raise _cannot(
            path,
            f"it needs {low} items (minItems or prefixItems) but allows at most {high} (maxItems)",
        )
    return low


def _between(low: float, low_open: bool, high: float, variant: int) -> float:
    """A float between two bounds: the lower one (or, excluded, the middle), then further
    along for each variant."""
    if low_open:  # the middle, then a third of the way, a quarter, ...
        return low + (high - low) / (variant + 2)
    return low + (high - low) * variant / (variant + 1)  # the bound, half way, two thirds...


def _first_integer(
    low: float | None, low_open: bool, high: float | None, high_open: bool
) -> int | None:
    """The smallest integer the bounds allow (1, or the upper bound, without a lower
    one); None when they allow none."""
    lo = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
    hi = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
    if lo is not None and hi is not None and lo > hi:
        return None
    return lo if lo is not None else (min(1, hi) if hi is not None else 1)


def _first_number(low: float | None, low_open: bool, high: float | None, high_open: bool) -> float:
    """Where a float starts: the lower bound (one past it if excluded), else 1 (or under
    the upper bound)."""
    if low is None:
        return 1.0 if high is None else min(1.0, high - 1 if high_open else high)
    if high is None:
        return low + 1 if low_open else low
    return low  # with a multipleOf (between two bounds without one: `_between`)


def _no_room(low: float | None, low_open: bool, high: float | None, high_open: bool) -> bool:
    """Whether the bounds exclude every number."""
    if low is None or high is None:
        return False
    return low > high or (low == high and (low_open or high_open))


def _on_step(value: float, step: float, low: float | None, low_open: bool) -> float:
    """The first multiple of `step` from `value` on (past `low` when it is excluded)."""
    value = math.ceil(value / step - 1e-9) * step
    if low_open and low is not None and value <= low:
        value += step
    return value


def _counted(length: int, variant: int) -> str:
    """`length` letters: "aaa", then for variants "aab", "aac", ... (the last counts first)."""
    letters = []
    left = variant
    for _ in range(length):
        left, digit = divmod(left, 26)
        letters.append(chr(ord("a") + digit))
    if left:
        raise _NoVariant
    return "".join(reversed(letters))


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _template(value: Any) -> str:
    """The arguments as JSON, with `...` where a value could not be made."""
    if isinstance(value, _Hole):
        return "..."
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_template(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_template(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, default=repr)


def _model_problems(exc: Exception) -> list[tuple[str, str]]:
    """What a validator refused, by JSON path (a pydantic ValidationError's locations)."""
    if not isinstance(exc, ValidationError):
        return [("$", f"the tool's model refused the arguments made: {exc}")]
    problems = []
    for error in exc.errors(include_url=False):
        path = "$"
        for part in error["loc"]:
            path = f"{path}[{part}]" if isinstance(part, int) else key_path(path, str(part))
        made = _short(error.get("input"))
        problems.append((path, f"the tool's model refused the value made ({made}): {error['msg']}"))
    return problems


def _now(steers: Mapping[str, Steer]) -> datetime.datetime:
    """A time for a maker that steers nothing (it is never read). The generator reads no
    clock: whoever steers a format gives the time (`now=`)."""
    if steers:
        raise TypeError("values= steers formats relative to now: give now= as well")
    return datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def example_arguments(
    schema: Mapping[str, Any],
    *,
    tool_name: str | None = None,
    validate: Callable[[dict[str, Any]], object] | None = None,
    steers: Mapping[str, Steer] | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """Arguments that fit a tool's input schema (see the module docstring), checked against
    it and, with `validate` (e.g. the tool's `model_validate`), against the model too.
    `steers`: the formats `values=` steers (`formats.steered_formats`), made at time `now`
    (aware; required with steers: the generator reads no clock).

    Raises `ConfigurationError` naming the tool, each field that cannot be filled by its
    JSON path and why, and the `arguments=` to pass by hand instead."""
    maker = _Maker(schema, steers, now)
    arguments: Any = {}
    try:
        arguments = maker.value(schema, "$")
        problems = maker.problems(arguments, schema, "$")
        if problems:
            raise _Unfillable(problems, arguments)
        if not isinstance(arguments, dict):
            raise _Unfillable([("$", "a tool's input schema must describe an object")])
        if validate is not None:
            try:
                validate(arguments)
            except Exception as exc:  # the model's own words: ValidationError, ToolArgumentsError
                raise _Unfillable(_model_problems(exc), arguments) from None
    except _Unfillable as exc:
        raise ConfigurationError(_unfillable_message(tool_name, exc, bool(steers))) from None
    except _NoVariant:  # (asked for by uniqueItems arrays only, which turn it into _Unfillable)
        problem = _cannot("$", "its values could not be made to differ (uniqueItems)")
        raise ConfigurationError(_unfillable_message(tool_name, problem, bool(steers))) from None
    return arguments


def _unfillable_message(tool_name: str | None, exc: _Unfillable, steered: bool = False) -> str:
    name = tool_name or "<tool name>"
    fields = "\n".join(f"  {path}: {why}" for path, why in exc.problems)
    holes = isinstance(exc.partial, dict)
    template = _template(exc.partial if holes else {})
    if len(template) > _TEMPLATE_CHARS:
        template = "{...}"
    one = len(exc.problems) == 1
    return (
        f"TestLLM cannot make arguments for tool {name!r} from its input schema:\n{fields}\n"
        + ("Change values= (the formats it steers), give " if steered else "Give ")
        + f"{'that field' if one else 'those fields'} a default that fits, or pass the "
        f"tool's arguments by hand: check_agent(module, arguments={{{json.dumps(name)}: "
        f"{template}}}), or TestLLM(arguments={{...}}) where you drive TestLLM yourself"
        + (" (fill in each ...)" if "..." in template else "")
        + "."
    )


def variant_arguments(
    schema: Mapping[str, Any],
    variant: int,
    *,
    steers: Mapping[str, Steer] | None = None,
    now: datetime.datetime | None = None,
) -> Any:
    """The `variant`-th other value the generator makes for `schema` (`variant=0` is
    `example_arguments`' value, `steers` and `now` as there), if it can make one that
    fits the schema; else None. For `check_agent`'s edits of a call's arguments."""
    maker = _Maker(schema, steers, now)
    try:
        value = maker.value(schema, "$", variant)
    except (_Unfillable, _NoVariant):
        return None
    return None if maker.problems(value, schema, "$") else value
