"""Example values for a JSON schema: the arguments `TestLLM` makes for a tool.

    example_arguments(tool.input_schema, tool_name="book_slot",
                      validate=Booking.model_validate)      # {"date": "1111-11-11", ...}

Follows what pydantic writes for a model (and what a hand-written schema
says): `$ref`/`$defs`, `const`/`enum` (`Literal`, `Enum`), `default` (when it
fits), `anyOf`/`oneOf` (`Optional`, unions: the first option that can be
filled), `allOf`, the type, and for each type its keywords: a string's
`minLength`/`maxLength`, `pattern` (an example string of its own,
`_regex_sample`), `format` (date, date-time, time, duration, email, uri,
uuid, ipv4, ipv6, hostname, ...) and JSON `contentSchema`; a number's bounds
(the smallest value they allow) and `multipleOf`; an array's `prefixItems`,
`items`, `minItems`/`maxItems` and `uniqueItems` (distinct items); an
object's `properties`, `required`, `additionalProperties`, `propertyNames`
and `minProperties`. An optional property that cannot be filled is left out
(the model's default applies); a required one cannot be.

Every value is checked against the schema it was made for, then, given
`validate` (the tool's pydantic model), against the model. What cannot be made
valid raises `ConfigurationError` naming the tool, each field by its JSON
path (`$.slot.date`) and why, and the `arguments=` to pass by hand.
Deterministic: the same schema always gives the same arguments.
"""

from __future__ import annotations

import copy
import datetime
import ipaddress
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from ..errors import ConfigurationError
from ._regex_sample import PatternNotSampled, pattern_search, sample_pattern

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


# -- formats ------------------------------------------------------------------------


def _date(variant: int) -> datetime.date:
    return datetime.date(2000, 1, 1) + datetime.timedelta(days=variant)


def _uuid(version: int) -> Callable[[int], str]:
    return lambda v: f"00000000-0000-{version}000-8000-{v:012x}"


def _email(v: int) -> str:
    return f"user{v or ''}@example.com"


def _url(v: int) -> str:
    return f"https://example.com/{v or ''}"


def _hostname(v: int) -> str:
    return f"host{v}.example.com" if v else "example.com"


def _ipv4(v: int) -> str:
    return str(ipaddress.IPv4Address(0x7F000001 + v))


def _ipv6(v: int) -> str:
    return str(ipaddress.IPv6Address(1 + v))


def _ipv4_network(v: int) -> str:
    return f"10.{v % 256}.0.0/16"


def _base64(v: int) -> str:
    return ["YWJj", "YWJk", "YWJl"][v] if v < 3 else f"YWJj{v:04d}"


# A valid value of each string format pydantic writes (date, UUID, HttpUrl, ...) or
# JSON schema names; the variant makes the k-th other one. Formats that accept the
# same values share one maker.
_FORMATS: Mapping[str, Callable[[int], str]] = {
    "date-time": lambda v: f"{_date(v).isoformat()}T00:00:00Z",
    "date": lambda v: _date(v).isoformat(),
    "time": lambda v: (
        (datetime.datetime(2000, 1, 1) + datetime.timedelta(seconds=v)).time().isoformat()
    ),
    "duration": lambda v: f"PT{v}S",
    "uuid": _uuid(4),
    **{f"uuid{n}": _uuid(n) for n in (1, 3, 4, 5, 6, 7, 8)},
    **dict.fromkeys(("email", "idn-email"), _email),
    **dict.fromkeys(
        ("uri", "url", "iri", "uri-reference", "iri-reference", "multi-host-uri"), _url
    ),
    **dict.fromkeys(("hostname", "idn-hostname"), _hostname),
    **dict.fromkeys(("ipv4", "ipvanyaddress"), _ipv4),
    "ipv6": _ipv6,
    **dict.fromkeys(("ipv4network", "ipvanynetwork"), _ipv4_network),
    "ipv6network": lambda v: f"fd00:{v:x}::/32",
    **dict.fromkeys(("ipv4interface", "ipvanyinterface"), lambda v: f"{_ipv4(v)}/8"),
    "ipv6interface": lambda v: f"{_ipv6(v)}/128",
    "json-pointer": lambda v: f"/a{v or ''}",
    "relative-json-pointer": lambda v: str(v),
    "regex": lambda v: f"a{v or ''}",
    **dict.fromkeys(("base64", "base64url", "byte"), _base64),
}

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_DURATION = re.compile(
    r"^P(?!$)(\d+Y)?(\d+M)?(\d+W)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$"
)


def _format_fits(name: str, text: str) -> bool:
    """Whether `text` is a valid `name` (formats it does not know: yes)."""
    try:
        if name == "date":
            datetime.date.fromisoformat(text)
        elif name == "date-time":
            datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        elif name == "time":
            datetime.time.fromisoformat(text.replace("Z", "+00:00"))
        elif name == "uuid" or (name.startswith("uuid") and name[4:].isdigit()):
            value = uuid.UUID(text)
            return name == "uuid" or value.version == int(name[4:])
        elif name == "ipv4":
            ipaddress.IPv4Address(text)
        elif name == "ipv6":
            ipaddress.IPv6Address(text)
        elif name in ("email", "idn-email"):
            return _EMAIL.match(text) is not None
        elif name in ("hostname", "idn-hostname"):
            return _HOSTNAME.match(text) is not None
        elif name in ("uri", "url", "iri", "multi-host-uri"):
            parts = urlsplit(text)
            return bool(parts.scheme and parts.netloc)
        elif name == "duration":
            return _DURATION.match(text) is not None
    except ValueError:
        return False
    return True


# -- paths and the JSON types -----------------------------------------------------------


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f"{path}[{key!r}]"


def _json_type(value: Any) -> str:
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


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 and True differ, 1 and 1.0 do not."""
    if _json_type(a) != _json_type(b):
        return False
    return bool(json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or a == b)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


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


# -- making values ----------------------------------------------------------------------


class _Maker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def resolve(self, schema: Any, path: str) -> Any:
        """`schema` with its `$ref`s followed (their siblings kept, as JSON schema 2019 does)."""
        seen = 0
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            seen += 1
            if seen > _MAX_DEPTH:
                raise _cannot(path, "its $ref chain does not end")
            ref = schema["$ref"]
            target: Any = self.root
            if not ref.startswith("#"):
                raise _cannot(path, f"its $ref {ref!r} points outside the schema")
            for part in filter(None, ref[1:].split("/")):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, Mapping) or part not in target:
                    raise _cannot(path, f"its $ref {ref!r} points nowhere in the schema")
                target = target[part]
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **siblings} if isinstance(target, Mapping) else target
        return schema

    def value(self, schema: Any, path: str, variant: int = 0, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise _cannot(
                path,
                f"the schema nests itself more than {_MAX_DEPTH} levels deep here (a "
                "recursive model with a required field of its own type?)",
            )
        schema = self.resolve(schema, path)
        if schema is True or schema == {}:
            if variant:
                raise _NoVariant
            return {}
        if schema is False:
            raise _cannot(path, "its schema is `false`: no value is allowed")
        if not isinstance(schema, Mapping):
            raise _cannot(path, f"its schema is not an object: {schema!r}")
        if "const" in schema:
            if variant:
                raise _NoVariant
            return copy.deepcopy(schema["const"])
        if (
            variant == 0
            and "default" in schema
            and not self.problems(schema["default"], schema, path)
        ):
            return copy.deepcopy(schema["default"])
        if isinstance(schema.get("enum"), list):
            return self.enum(schema, path, variant)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.union(schema, key, path, variant, depth)
        if isinstance(schema.get("allOf"), list) and schema["allOf"]:
            merged = self.merge(schema, path)
            value = self.value(merged, path, variant, depth + 1)
            found = self.problems(value, schema, path)
            if found:
                raise _Unfillable(found, value)
            return value
        kind = _kind(schema)
        if kind == "object":
            return self.object(schema, path, variant, depth)
        if kind == "array":
            return self.array(schema, path, variant, depth)
        if kind == "string":
            return self.string(schema, path, variant, depth)
        if kind in ("integer", "number"):
            return self.number(schema, path, variant, integer=kind == "integer")
        if kind == "boolean":
            if variant > 1:
                raise _NoVariant
            return variant == 1
        if kind == "null":
            if variant:
                raise _NoVariant
            return None
        raise _cannot(path, f"its type {kind!r} is not a JSON type")

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
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = [r for r in schema.get("required") or () if isinstance(r, str)]
        extra = schema.get("additionalProperties", True)
        extra_schema = extra if isinstance(extra, Mapping) else {}
        result: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        named = [*properties, *(r for r in required if r not in properties)]
        for name in named:
            sub = properties.get(name, extra_schema)
            where = _key_path(path, name)
            try:
                try:
                    result[name] = self.value(sub, where, variant, depth + 1)
                except _NoVariant:
                    result[name] = self.value(sub, where, 0, depth + 1)
            except _Unfillable as exc:
                if name in required:
                    problems += exc.problems
                    result[name] = exc.partial
        wanted = int(schema.get("minProperties", 0))
        if len(result) < wanted and not problems:
            if extra is False:
                raise _cannot(
                    path,
                    f"it needs {wanted} properties (minProperties) but allows only "
                    f"{len(properties)}",
                )
            names_schema = schema.get("propertyNames") or {"type": "string"}
            for k in range(wanted * 4 + 26):
                if len(result) >= wanted:
                    break
                try:
                    key = self.value(names_schema, f"{path} (a property name)", k, depth + 1)
                except _NoVariant:
                    break
                if isinstance(key, str) and key not in result:
                    result[key] = self.value(extra_schema, _key_path(path, key), 0, depth + 1)
            if len(result) < wanted:
                raise _cannot(
                    path,
                    f"it needs {wanted} properties (minProperties); only {len(result)} "
                    "distinct property names were found",
                )
        if problems:
            raise _Unfillable(problems, result)
        return result

    def array(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> Any:
        items = schema.get("items")
        tuple_items = items if isinstance(items, list) else []  # draft 4's tuples
        prefix: Sequence[Any] = schema.get("prefixItems") or tuple_items
        if isinstance(items, (Mapping, bool)):
            item: Any = items
        else:
            additional = schema.get("additionalItems")
            item = additional if isinstance(additional, Mapping) else {}
        low = max(len(prefix), int(schema.get("minItems", 0)))
        high = schema.get("maxItems")
        if high is not None and low > int(high):
            raise _cannot(
                path,
                f"it needs {low} items (minItems or prefixItems) but allows at most "
                f"{high} (maxItems)",
            )
        unique = bool(schema.get("uniqueItems"))
        if variant and low == 0:
            raise _NoVariant
        values: list[Any] = []
        problems: list[tuple[str, str]] = []
        for i in range(low):
            sub = prefix[i] if i < len(prefix) else item
            wanted = (i + variant * low) if unique else (variant if i == 0 else 0)
            where = f"{path}[{i}]"
            try:
                values.append(self.value(sub, where, wanted, depth + 1))
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
        if unique and len({_canonical(v) for v in values}) < len(values):
            raise _cannot(path, "its items must all differ (uniqueItems), and the ones made do not")
        return values

    def string(self, schema: Mapping[str, Any], path: str, variant: int, depth: int) -> str:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        high = None if high is None else int(high)
        if high is not None and low > high:
            raise _cannot(path, f"its minLength {low} is over its maxLength {high}")
        content = schema.get("contentSchema")
        if isinstance(content, (Mapping, bool)):  # JSON inside a string (pydantic's Json)
            return json.dumps(self.value(content, f"{path} (its JSON content)", variant, depth + 1))
        form = schema.get("format")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            try:
                text = sample_pattern(pattern, min_length=low, max_length=high, variant=variant)
            except PatternNotSampled as exc:
                raise _Unfillable([(path, f"its pattern '{pattern}': {exc.reason}")]) from None
            if text is None:
                raise _NoVariant
            if isinstance(form, str) and not _format_fits(form, text):
                made = _FORMATS[form](variant) if form in _FORMATS else None
                search = pattern_search(pattern)
                if made is not None and (search is None or search(made)):
                    return made
                raise _cannot(
                    path,
                    f"its pattern '{pattern}' gives {text!r}, which is not a valid {form}",
                )
            return text
        if isinstance(form, str) and form in _FORMATS:
            text = _FORMATS[form](variant)
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
        low, low_open = _bound(schema, "minimum", "exclusiveMinimum", max)
        high, high_open = _bound(schema, "maximum", "exclusiveMaximum", min)
        step = schema.get("multipleOf")
        empty = (
            low is not None
            and high is not None
            and (low > high or (low == high and (low_open or high_open)))
        )
        value: float
        if integer:
            lo = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
            hi = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
            empty = empty or (lo is not None and hi is not None and lo > hi)
            value = lo if lo is not None else (min(1, hi) if hi is not None else 1)
        elif low is None:
            value = 1.0 if high is None else min(1.0, high - 1 if high_open else high)
        elif high is None:
            value = low + 1 if low_open else low
        elif step:
            value = low
        elif low_open:  # the middle, then a third of the way, a quarter, ...
            return low + (high - low) / (variant + 2)
        else:  # the bound, then half way, two thirds, ...
            return low + (high - low) * variant / (variant + 1)
        if empty:
            what = "integer" if integer else "number"
            raise _cannot(path, f"no {what} lies within its bounds ({_describe_bounds(schema)})")
        if step:
            value = math.ceil(value / step - 1e-9) * step
            if low_open and low is not None and value <= low:
                value += step
            if integer and not float(value).is_integer():
                raise _cannot(path, f"its multipleOf {step} allows no integer")
        value += variant * (step or 1)
        if high is not None and (value > high or (high_open and value >= high)):
            if variant:
                raise _NoVariant
            raise _cannot(
                path,
                f"no multiple of {step} lies within its bounds ({_describe_bounds(schema)})",
            )
        return int(value) if integer else float(value)

    # -- the check --------------------------------------------------------------------

    def problems(self, value: Any, schema: Any, path: str, depth: int = 0) -> list[tuple[str, str]]:
        """Where `value` breaks `schema`: (JSON path, why) pairs; [] when it fits."""
        if depth > _MAX_DEPTH * 2:
            return []
        try:
            schema = self.resolve(schema, path)
        except _Unfillable as exc:
            return exc.problems
        if schema is True or not isinstance(schema, Mapping):
            return [] if schema is not False else [(path, "its schema allows no value")]
        found: list[tuple[str, str]] = []

        def bad(why: str) -> list[tuple[str, str]]:
            return [(path, f"{why} (the value made: {_short(value)})")]

        if "const" in schema and not _same(value, schema["const"]):
            return bad(f"it must be {schema['const']!r}")
        if isinstance(schema.get("enum"), list) and not any(
            _same(value, e) for e in schema["enum"]
        ):
            return bad(f"it must be one of {schema['enum']!r}")
        kinds = schema.get("type")
        if kinds is not None:
            names = kinds if isinstance(kinds, list) else [kinds]
            actual = _json_type(value)
            if not any(actual == n or (n == "number" and actual == "integer") for n in names):
                return bad(f"it must be of type {' or '.join(map(str, names))}")
        for sub in schema.get("allOf") or ():
            found += self.problems(value, sub, path, depth + 1)
        options = schema.get("anyOf")
        if isinstance(options, list) and all(
            self.problems(value, s, path, depth + 1) for s in options
        ):
            found += bad("it fits none of its anyOf options")
        if isinstance(schema.get("oneOf"), list) and schema["oneOf"]:
            fits = sum(1 for s in schema["oneOf"] if not self.problems(value, s, path, depth + 1))
            if fits != 1:
                found += bad(f"it must fit exactly one of its oneOf options, and fits {fits}")
        if "not" in schema and not self.problems(value, schema["not"], path, depth + 1):
            found += bad("it fits the schema under `not`")
        if isinstance(value, str):
            found += self.string_problems(value, schema, path, depth, bad)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found += _number_problems(value, schema, bad)
        elif isinstance(value, list):
            found += self.array_problems(value, schema, path, depth, bad)
        elif isinstance(value, dict):
            found += self.object_problems(value, schema, path, depth, bad)
        return found

    def string_problems(
        self, value: str, schema: Mapping[str, Any], path: str, depth: int,
        bad: Callable[[str], list[tuple[str, str]]],
    ) -> list[tuple[str, str]]:  # fmt: skip
        found = []
        if len(value) < int(schema.get("minLength", 0)):
            found += bad(f"it must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > int(schema["maxLength"]):
            found += bad(f"it must have at most {schema['maxLength']} characters")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            search = pattern_search(pattern)
            if search is not None and not search(value):
                found += bad(f"it must match the pattern '{pattern}'")
        form = schema.get("format")
        if isinstance(form, str) and not _format_fits(form, value):
            found += bad(f"it must be a valid {form}")
        content = schema.get("contentSchema")
        if isinstance(content, (Mapping, bool)):
            try:
                found += self.problems(json.loads(value), content, path, depth + 1)
            except ValueError:
                found += bad("it must be JSON")
        return found

    def array_problems(
        self, value: list[Any], schema: Mapping[str, Any], path: str, depth: int,
        bad: Callable[[str], list[tuple[str, str]]],
    ) -> list[tuple[str, str]]:  # fmt: skip
        found = []
        if len(value) < int(schema.get("minItems", 0)):
            found += bad(f"it must have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > int(schema["maxItems"]):
            found += bad(f"it must have at most {schema['maxItems']} items")
        if schema.get("uniqueItems") and len({_canonical(v) for v in value}) < len(value):
            found += bad("its items must all differ")
        items = schema.get("items")
        prefix = schema.get("prefixItems") or (items if isinstance(items, list) else [])
        rest = items if isinstance(items, (Mapping, bool)) else schema.get("additionalItems")
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else rest
            if sub is not None:
                found += self.problems(item, sub, f"{path}[{i}]", depth + 1)
        return found

    def object_problems(
        self, value: dict[str, Any], schema: Mapping[str, Any], path: str, depth: int,
        bad: Callable[[str], list[tuple[str, str]]],
    ) -> list[tuple[str, str]]:  # fmt: skip
        found = []
        properties: Mapping[str, Any] = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                found.append((_key_path(path, str(name)), "it is required and missing"))
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            where = _key_path(path, key)
            if key in properties:
                found += self.problems(item, properties[key], where, depth + 1)
            elif extra is False:
                found.append((where, "no such property is allowed (additionalProperties: false)"))
            elif isinstance(extra, Mapping):
                found += self.problems(item, extra, where, depth + 1)
            names = schema.get("propertyNames")
            if names is not None:
                found += self.problems(key, names, f"{where} (its name)", depth + 1)
        if len(value) < int(schema.get("minProperties", 0)):
            found += bad(f"it must have at least {schema['minProperties']} properties")
        return found


def _number_problems(
    value: float, schema: Mapping[str, Any], bad: Callable[[str], list[tuple[str, str]]]
) -> list[tuple[str, str]]:
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum", min)
    if (low is not None and (value < low or (low_open and value == low))) or (
        high is not None and (value > high or (high_open and value == high))
    ):
        return bad(f"it must lie within {_describe_bounds(schema)}")
    step = schema.get("multipleOf")
    if step:
        ratio = value / step
        if abs(ratio - round(ratio)) > 1e-9 * max(1.0, abs(ratio)):
            return bad(f"it must be a multiple of {step}")
    return []


def _bound(
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


def _describe_bounds(schema: Mapping[str, Any]) -> str:
    keys = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf")
    return ", ".join(f"{k} {schema[k]}" for k in keys if k in schema)


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
            path = f"{path}[{part}]" if isinstance(part, int) else _key_path(path, str(part))
        made = _short(error.get("input"))
        problems.append((path, f"the tool's model refused the value made ({made}): {error['msg']}"))
    return problems


def example_arguments(
    schema: Mapping[str, Any],
    *,
    tool_name: str | None = None,
    validate: Callable[[dict[str, Any]], object] | None = None,
) -> dict[str, Any]:
    """Arguments that fit a tool's input schema (see the module docstring), checked against
    it and, with `validate` (e.g. the tool's `model_validate`), against the model too.

    Raises `ConfigurationError` naming the tool, each field that cannot be filled by its
    JSON path and why, and the `arguments=` to pass by hand instead."""
    maker = _Maker(schema)
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
        raise ConfigurationError(_unfillable_message(tool_name, exc)) from None
    except _NoVariant:  # (asked for by uniqueItems arrays only, which turn it into _Unfillable)
        problem = _cannot("$", "its values could not be made to differ (uniqueItems)")
        raise ConfigurationError(_unfillable_message(tool_name, problem)) from None
    return arguments


def _unfillable_message(tool_name: str | None, exc: _Unfillable) -> str:
    name = tool_name or "<tool name>"
    fields = "\n".join(f"  {path}: {why}" for path, why in exc.problems)
    holes = isinstance(exc.partial, dict)
    template = _template(exc.partial if holes else {})
    if len(template) > _TEMPLATE_CHARS:
        template = "{...}"
    one = len(exc.problems) == 1
    return (
        f"TestLLM cannot make arguments for tool {name!r} from its input schema:\n{fields}\n"
        f"Give {'that field' if one else 'those fields'} a default that fits, or pass the "
        f"tool's arguments by hand: check_agent(module, arguments={{{json.dumps(name)}: "
        f"{template}}}), or TestLLM(arguments={{...}}) where you drive TestLLM yourself"
        + (" (fill in each ...)" if "..." in template else "")
        + "."
    )
