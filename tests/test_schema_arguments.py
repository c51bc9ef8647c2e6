"""TestLLM's arguments from a tool's schema: patterns, formats, bounds, unions, nesting.

Every model below is a tool input a user could write; the arguments made for it must
validate against the model itself (`arguments_for(..., validate=Model.model_validate)`
checks, and so does each test). What cannot be filled must be said by tool and field.
"""

from __future__ import annotations

import re
import sys
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum, IntEnum
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from pydantic import (
    UUID1,
    AnyUrl,
    BaseModel,
    ConfigDict,
    Field,
    FutureDate,
    HttpUrl,
    IPvAnyAddress,
    IPvAnyNetwork,
    Json,
    SecretStr,
    conint,
    conlist,
    constr,
)

from durable_agents import Agent, ConfigurationError, ToolArgumentsError, ToolContext, run, tool
from durable_agents._schema.check import json_type, schema_problems
from durable_agents._schema.plain import plain_check
from durable_agents._schema.regex_sample import PatternNotSampled, sample_pattern
from durable_agents.llm.offline import arguments_for
from durable_agents.testing import TestLLM

# -- a table of models: each field kind, and its arguments validate ------------------


class Color(Enum):
    RED = "red"
    GREEN = "green"


class Priority(IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    street: str = Field(min_length=3)
    postcode: str = Field(pattern=r"^[1-9]\d{3} ?[A-Z]{2}$")


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(default=9, ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Patterns(BaseModel):
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    time: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    phone: str = Field(pattern=r"^\+?[1-9]\d{7,14}$")
    sku: str = Field(pattern=r"^[A-Z]{3}-\d{4}(?:-[a-z]{2})?$")
    email_like: str = Field(pattern=r"^[\w.+-]+@[\w-]+\.[a-z]{2,}$")
    hex_color: str = Field(pattern=r"^#(?:[0-9a-fA-F]{3}){1,2}$")
    slug: str = Field(pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$", min_length=12, max_length=20)
    no_spaces: str = Field(pattern=r"^[^\s@]+$")
    anywhere: str = Field(pattern=r"\d{3}", min_length=6)  # searched for, not matched whole
    title: str = Field(pattern=r"^(?:Mr|Ms|Dr)\.? [A-Z][a-z]+$")
    named: str = Field(pattern=r"^(?P<area>\d{3})-\d{4}$")
    code: constr(pattern=r"^[A-Z]{2}\d{2}$", to_upper=True)  # type: ignore[valid-type]


class Formats(BaseModel):
    day: date
    when: datetime
    at: time
    wait: timedelta
    ident: UUID
    v1: UUID1
    url: HttpUrl
    any_url: AnyUrl
    ipv4: IPv4Address
    ipv6: IPv6Address
    ip: IPvAnyAddress
    network: IPvAnyNetwork
    email: str = Field(json_schema_extra={"format": "email"})
    host: str = Field(json_schema_extra={"format": "hostname"})
    secret: SecretStr
    path: Path
    raw: bytes
    payload: Json[dict[str, int]]


class Numbers(BaseModel):
    count: int = Field(ge=5)
    positive: int = Field(gt=0)
    negative: int = Field(lt=-3)
    ceiling: int = Field(le=0)
    fraction: float = Field(gt=0, lt=0.1)
    step: int = Field(ge=1, multiple_of=5)
    above: int = Field(gt=10, multiple_of=7)
    half_steps: float = Field(ge=0.25, multiple_of=0.5)
    small: conint(gt=3, lt=5)  # type: ignore[valid-type]
    amount: Decimal
    cents: Decimal = Field(max_digits=5, decimal_places=2, gt=0)
    flag: bool


class Choices(BaseModel):
    color: Color
    priority: Priority
    mode: Literal["fast", "slow"]
    fixed: Literal["only"]
    number: Literal[3, 4]
    maybe: int | None
    maybe_pattern: Annotated[str, Field(pattern=r"^\d{2}$")] | None
    either: int | str
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]
    defaulted: str = "keep me"
    bad_default: str = Field(default="", min_length=2)  # a default that does not fit


class Collections(BaseModel):
    tags: list[str] = Field(min_length=2, max_length=4)
    unique: set[int] = Field(min_length=3)
    unique_codes: set[Annotated[str, Field(pattern=r"^[A-Z]\d$")]] = Field(min_length=3)
    frozen: frozenset[Color] = Field(min_length=2)
    bounded: conlist(int, min_length=2, max_length=3)  # type: ignore[valid-type]
    pair: tuple[int, str]
    rest: tuple[int, ...]
    scores: dict[str, int] = Field(min_length=2)
    keyed: dict[Literal["x", "y"], Address] = Field(min_length=1)
    addresses: list[Address] = Field(min_length=2)
    nested: list[list[Annotated[int, Field(ge=10)]]] = Field(min_length=1)


class Node(BaseModel):
    name: str
    child: Node | None = None
    children: list[Node] = []


class Order(BaseModel):
    """Everything at once, nested: $defs, $ref, objects in objects."""

    patterns: Patterns
    formats: Formats
    numbers: Numbers
    choices: Choices
    collections: Collections
    tree: Node


MODELS = [Address, Patterns, Formats, Numbers, Choices, Collections, Node, Order]


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_arguments_validate_against_the_model_they_came_from(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()
    arguments = arguments_for(schema, tool_name="t", validate=model.model_validate)
    model.model_validate(arguments)  # raises if any field is wrong
    assert arguments_for(schema) == arguments  # deterministic, with or without the check


def test_what_the_values_look_like() -> None:
    made = arguments_for(Order.model_json_schema(), validate=Order.model_validate)
    patterns, formats, numbers = made["patterns"], made["formats"], made["numbers"]
    assert date.fromisoformat(patterns["date"])  # "1111-11-11": a real date
    assert patterns["time"] == "11:11"
    assert 12 <= len(patterns["slug"]) <= 20
    assert re.search(r"\d{3}", patterns["anywhere"])
    assert len(patterns["anywhere"]) >= 6
    assert formats["email"] == "user@example.com"
    assert formats["url"] == "https://example.com/"
    assert UUID(formats["v1"]).version == 1
    assert (numbers["count"], numbers["positive"], numbers["negative"]) == (5, 1, -4)
    assert (numbers["step"], numbers["above"], numbers["small"]) == (5, 14, 4)
    assert 0 < numbers["fraction"] < 0.1
    choices = Choices.model_validate(made["choices"])
    assert (choices.color, choices.mode, choices.fixed, choices.number) == (
        Color.RED,
        "fast",
        "only",
        3,
    )
    assert choices.maybe == 1  # Optional: a value of its type, not None
    assert choices.defaulted == "keep me"
    assert len(choices.bad_default) >= 2  # its default does not fit: made anew
    collections = Collections.model_validate(made["collections"])
    assert len(collections.unique) == 3
    assert len(collections.unique_codes) == 3
    assert collections.frozen == {Color.RED, Color.GREEN}
    assert len(collections.scores) == 2


def test_hand_written_json_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "labels": {"type": "array", "items": {"type": "string"}},
            "both": {
                "allOf": [
                    {"type": "string", "minLength": 3},
                    {"type": "string", "maxLength": 4, "pattern": "^[a-z]+$"},
                ]
            },
            "ref": {"$ref": "#/definitions/Code"},
            "one": {
                "oneOf": [{"type": "integer", "maximum": 0}, {"type": "integer", "minimum": 1}]
            },
            "nullable": {"type": ["null", "string"], "format": "date"},
            "strict": {
                "type": "object",
                "properties": {"a": {"const": 1}},
                "additionalProperties": False,
                "required": ["a"],
            },
            "draft4": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        },
        "required": ["id", "both", "ref", "one", "strict"],
        "definitions": {"Code": {"type": "string", "pattern": "^C-\\d{3}$"}},
    }
    assert arguments_for(schema) == {
        "id": 1,
        "labels": [],
        "both": "aaa",
        "ref": "C-111",
        "one": 0,
        "nullable": "2000-01-01",
        "strict": {"a": 1},
        "draft4": 1.0,
    }


# -- regular expressions ------------------------------------------------------------

PATTERNS = [
    r"^\d{4}-\d{2}-\d{2}$",
    r"^[A-Z]{3}-\d+$",
    r"^(?:mr|ms)\.? [A-Z][a-z]+$",
    r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$",
    r"^\+?[1-9]\d{1,14}$",
    r"^(0[1-9]|1[0-2])/\d{2}$",
    r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
    r"\bfoo\b",
    r"(?i)^ab+c$",
    r"^\x41\u00e9\t?\n*$",
    r"^[^a-z\d]{2}$",
    r"^.{3,5}$",
    r"^(a|bb|ccc){2}$",
    r"^$",
    r"^a{0}b{,2}c{2,}$",
    r"^[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?$",
    r"^[\]\\-]+$",
    r"^\s*\S+\s*$",
    r"^(a+)-\1$",
    r"^\W\D\S$",
    r"^(?#a comment)x$",
    r"^a+?b*+$",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_sample_matches_its_pattern_and_its_lengths(pattern: str) -> None:
    compiled = re.compile(pattern)
    text = sample_pattern(pattern)
    assert text is not None
    assert compiled.search(text), text
    try:
        longer = sample_pattern(pattern, min_length=6, max_length=30)
    except PatternNotSampled as exc:
        failure: PatternNotSampled | None = exc
        longer = None
    else:
        failure = None
    if longer is None:  # only a pattern whose matches are all shorter or longer, saying so
        assert failure is not None
        assert re.search(
            r"characters, (fewer than minLength 6|more than maxLength 30)$", failure.reason
        )
    else:
        assert compiled.search(longer)
        assert 6 <= len(longer) <= 30
    variants = [sample_pattern(pattern, variant=k) for k in range(4)]
    made = [v for v in variants if v is not None]
    assert len(set(made)) == len(made)  # each variant is another string
    assert all(compiled.search(v) for v in made)


def test_patterns_pythons_re_reads_otherwise_are_still_followed() -> None:
    # The regex dialects of JSON schema and pydantic (Rust's) have these; `re` has not.
    assert sample_pattern(r"^[[:alpha:]]+[[:digit:]]$") == "a1"
    assert sample_pattern(r"^\p{Lu}\p{Ll}+$") == "Aa"
    assert sample_pattern(r"^\x{41}\u{42}$") == "AB"
    assert sample_pattern(r"^(?<year>\d{4})-\k<year>$") == "1111-1111"


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"^(?=.*\d).+$", "a lookahead '(?=' (at position 1)"),
        (r"^(?!x).$", "a negative lookahead '(?!'"),
        (r"(?<=a)b", "a lookbehind '(?<='"),
        (r"(?<!a)b", "a negative lookbehind '(?<!'"),
        (r"(?x) a b", "verbose mode"),
        (r"[a-z&&[^b]]", "class set operation '&&'"),
        (r"^\q$", "the escape '\\q'"),
        (r"(a)(?(1)b|c)", "a conditional group"),
        (r"a{3,2}", "bounds reversed"),
        (r"*a", "nothing to repeat"),
        (r"(a", "without its ')'"),
        (r"a)", "unbalanced ')'"),
        (r"^\p{Greek}$", "only general categories"),
        (r"^\d{4}$", "its longest match has 4 characters, fewer than minLength 5"),
    ],
)
def test_what_it_cannot_follow_is_said(pattern: str, reason: str) -> None:
    with pytest.raises(PatternNotSampled) as failure:
        sample_pattern(pattern, min_length=5)
    assert reason in failure.value.reason
    assert pattern in str(failure.value)


def test_a_pattern_shorter_than_max_length_allows_is_said() -> None:
    with pytest.raises(PatternNotSampled, match="shortest match has 4 characters, more than"):
        sample_pattern(r"^\d{4}$", max_length=3)


# -- what cannot be filled, said by tool and field ----------------------------------


class Lookahead(BaseModel):
    model_config = ConfigDict(regex_engine="python-re")
    code: str = Field(pattern=r"^(?=.*\d)[A-Z0-9]{6}$")
    optional_code: str | None = Field(default=None, pattern=r"^(?=x)x$")  # left out


class Booking(BaseModel):
    day: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    codes: list[Lookahead] = Field(min_length=1)
    inner: Lookahead


def test_an_unfillable_field_is_named_with_its_path_and_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as failure:
        arguments_for(
            Booking.model_json_schema(), tool_name="book_slot", validate=Booking.model_validate
        )
    text = str(failure.value)
    assert text.startswith("TestLLM cannot make arguments for tool 'book_slot'")
    assert "  $.codes[0].code: its pattern '^(?=.*\\d)[A-Z0-9]{6}$': a lookahead '(?='" in text
    assert "  $.inner.code: its pattern" in text
    assert "optional_code" not in text.split("Give")[0]  # its default fits: no failure
    assert (
        'check_agent(module, arguments={"book_slot": {"day": "1111-11-11", "codes": '
        '[{"code": ..., "optional_code": null}], "inner": {"code": ..., "optional_code": '
        "null}}})"
    ) in text
    assert "TestLLM(arguments={...})" in text


def test_what_the_model_itself_refuses_is_named_too() -> None:
    class Appointment(BaseModel):
        on: FutureDate  # the schema says "date"; only the model knows "in the future"

    with pytest.raises(ConfigurationError) as failure:
        arguments_for(
            Appointment.model_json_schema(), tool_name="book", validate=Appointment.model_validate
        )
    text = str(failure.value)
    assert '$.on: the tool\'s model refused the value made ("2000-01-01")' in text
    assert "Date should be in the future" in text


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "integer", "minimum": 5, "maximum": 3}, "no integer lies within its bounds"),
        ({"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5}, "no multiple of 5"),
        ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength 3 is over its maxLength"),
        ({"type": "array", "items": {"type": "boolean"}, "minItems": 3, "uniqueItems": True},
         "its item schema allows only 2 different values"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, "allows at most 2 (maxItems)"),
        ({"enum": ["a"], "type": "integer"}, "none of its enum values"),
        ({"anyOf": [{"type": "integer", "minimum": 2, "maximum": 1},
                    {"const": 1, "type": "string"}]},
         "none of its anyOf options can be filled"),
        ({"$ref": "#/$defs/Missing"}, "points nowhere in the schema"),
        (False, "no value is allowed"),
    ],
)  # fmt: skip
def test_impossible_schemas_say_why(schema: Any, reason: str) -> None:
    wrapped = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    with pytest.raises(ConfigurationError) as failure:
        arguments_for(wrapped, tool_name="t")
    text = str(failure.value)
    assert "tool 't'" in text
    assert re.search(rf"\n  \$\.x: [^\n]*{re.escape(reason)}", text), text


# -- TestLLM ----------------------------------------------------------------------------


class SlotDay(BaseModel):
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")


async def test_testllm_fills_patterns_and_says_what_it_cannot_fill() -> None:
    seen: list[str] = []

    @tool(safe_to_retry=True)
    async def find_slots(args: SlotDay, ctx: ToolContext) -> list[str]:
        """Free slots on a day."""
        seen.append(date.fromisoformat(args.date).isoformat())
        return ["09:00"]

    @tool
    async def redeem(args: Lookahead, ctx: ToolContext) -> str:
        """Redeem a code."""
        seen.append(args.code)
        return "ok"

    result = await run(Agent("a", "x", [find_slots]), llm=TestLLM(), message="hi")
    assert (result.status, seen) == ("complete", ["1111-11-11"])

    agent = Agent("a", "x", [find_slots, redeem])
    failed = await run(agent, llm=TestLLM(), message="hi")
    assert failed.status == "error"
    assert "tool 'redeem'" in (failed.error or "")
    assert "$.code" in (failed.error or "")

    given = TestLLM(arguments={"redeem": {"code": "ABC123"}})
    result = await run(agent, llm=given, message="hi")
    assert result.status == "complete"
    assert seen[-2:] == ["1111-11-11", "ABC123"] or seen[-2:] == ["ABC123", "1111-11-11"]


def test_the_generator_draws_on_no_randomness_or_clock() -> None:
    # Pyodide imports the kit at startup, where neither may be read; and the same schema
    # must always give the same arguments.
    sources = [
        Path(sys.modules[name].__file__ or "").read_text()
        for name in ("durable_agents._schema.regex_sample", "durable_agents._schema.values")
    ]
    for source in sources:
        assert not re.search(r"^\s*(import|from) (random|secrets|time)\b", source, re.M)
        assert not re.search(r"\.(now|today|utcnow)\(", source)


# -- the one check: a schema-only tool's arguments, and the values made ----------------


def test_json_types_count_an_integral_float_as_an_integer() -> None:
    assert [json_type(v) for v in (1, 1.0, 1.5, True, None, "x", [], {})] == [
        "integer", "integer", "number", "boolean", "null", "string", "array", "object",
    ]  # fmt: skip


def test_a_schema_only_tool_is_checked_by_the_same_check_as_the_values_made() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1},
            "day": {"type": "string", "format": "date"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        },
        "required": ["n"],
        "additionalProperties": False,
    }
    lookup = tool(name="lookup", description="Look up.", input=schema)
    # 2.0 is an integer (JSON Schema's count); `format` is an annotation for a tool's check.
    fine = {"n": 2.0, "day": "someday", "code": "ABC"}
    assert lookup.parse_arguments(fine) == fine
    with pytest.raises(ToolArgumentsError) as failure:
        lookup.parse_arguments({"n": 0, "code": "abc", "x": 1})
    assert failure.value.problems == (
        "arguments.n: must lie within minimum 1; arguments.code: must match the pattern "
        "'^[A-Z]{3}$'; arguments.x: not allowed"
    )
    # The generator holds the format too, so what it makes is a date.
    assert arguments_for(schema) == {"n": 1, "day": "2000-01-01", "code": "AAA"}


PLAIN_SCHEMAS: list[dict[str, Any]] = [
    {"properties": {"item": {"type": "string"}}, "required": ["item"]},
    {
        "type": "object",
        "properties": {"n": {"type": "number", "description": "any"}, "on": {"type": "boolean"}},
        "additionalProperties": False,
    },
    {"properties": {"anything": {}, "list": {"type": "array"}, "none": {"type": "null"}}},
]
PLAIN_VALUES: list[dict[Any, Any]] = [
    {}, {"item": "a"}, {"item": 1}, {"n": 1}, {"n": 1.5}, {"n": True}, {"on": False},
    {"anything": [1]}, {"list": []}, {"list": {}}, {"none": None}, {"other": 1}, {1: "a"},
]  # fmt: skip


@pytest.mark.parametrize("schema", PLAIN_SCHEMAS)
def test_a_flat_schemas_plain_check_fits_what_the_general_check_finds_nothing_in(
    schema: dict[str, Any],
) -> None:
    # Built once per tool, it decides only when a value fits: else the general check runs.
    fits = plain_check(schema)
    assert fits is not None
    for value in PLAIN_VALUES:
        if all(isinstance(key, str) for key in value):
            assert fits(value) == (not schema_problems(value, schema, "arguments")), value
        else:
            assert not fits(value)  # (the general check says what it makes of such a key)


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"item": {"type": "string", "minLength": 2}}},
        {"properties": {"item": {"type": ["string", "null"]}}},
        {"properties": {"item": {"$ref": "#/$defs/item"}}, "$defs": {"item": {}}},
        {"properties": {}, "additionalProperties": {"type": "string"}},
        {"type": "string"},
        {"properties": {}, "required": "item"},
        {"anyOf": [{"type": "object"}]},
    ],
)
def test_any_other_schema_has_no_plain_check(schema: dict[str, Any]) -> None:
    assert plain_check(schema) is None
