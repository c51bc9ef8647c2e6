"""`@tool` on a function with plain parameters: the JSON schema and descriptions are
pydantic-ai's (compared with `pydantic_ai.Tool(fn).function_schema`, which only this test
imports), the handler gets the checked values and the ToolContext wherever it stands,
bad arguments are an `invalid-arguments` result, and the model form is as it was.

This module has `from __future__ import annotations`, so every annotation below is a
string the kit resolves (with the function's globals), as in a user's module.
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Annotated, Any, Literal, NamedTuple, Optional
from uuid import UUID

import httpx
import pydantic_ai
import pytest
from pydantic import BaseModel, Field
from pydantic_ai import RunContext as PaiContext
from typing_extensions import TypedDict

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    ToolArgumentsError,
    ToolCall,
    ToolContext,
    run,
    tool,
)
from durable_agents.llm.offline import arguments_for
from durable_agents.messages import tool_error
from durable_agents.testing import ScriptedLLM, check_agent
from durable_agents.tools import RunContext

SRC = Path(__file__).resolve().parents[1] / "src" / "durable_agents"


class Genre(enum.StrEnum):
    FICTION = "fiction"
    POETRY = "poetry"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = "Paris"


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-\d+$")
    quantity: int = Field(default=1, ge=1)


class Node(BaseModel):
    name: str
    children: list[Node] = []


@dataclass
class Window:
    start: date
    days: int = 7
    """How many days."""


class Filter(TypedDict):
    genre: Genre
    """Only this genre."""
    since: int


class Point(NamedTuple):
    x: int
    y: int


@dataclass
class Deps:
    library: str


# -- the signatures: each compared with pydantic-ai's reading of it ----------------------


async def search_catalog(
    ctx: ToolContext[Deps], query: str, genre: Genre, limit: int = 10
) -> list[str]:
    """Search the library's catalogue.

    Matches titles and authors.

    Args:
        query: What to look for.
        genre: Only books of this genre.
        limit: At most this many
            titles.

    Returns:
        The matching titles.
    """
    return [f"{query}/{genre.value}/{limit}/{ctx.deps.library}"]


async def search_catalog_pai(
    ctx: PaiContext[Deps], query: str, genre: Genre, limit: int = 10
) -> list[str]:
    """Search the library's catalogue.

    Matches titles and authors.

    Args:
        query: What to look for.
        genre: Only books of this genre.
        limit: At most this many
            titles.

    Returns:
        The matching titles.
    """
    return []


def renew_loan(loan_id: str, until: date, ctx: ToolContext) -> str:
    """Renew a loan (a sync handler, the context last).

    Args:
        loan_id: The loan.
        until: The new due date.
    """
    return f"{loan_id} until {until.isoformat()} ({ctx.tool_call_id})"


def renew_loan_pai(loan_id: str, until: date) -> str:
    """Renew a loan (a sync handler, the context last).

    Args:
        loan_id: The loan.
        until: The new due date.
    """
    return ""


def scalars(name: str, count: int, ratio: float, on: bool = False) -> str:
    return name


def choices(
    mode: Literal["fast", "slow"],
    level: int | None,
    note: Optional[str] = None,  # noqa: UP045 - the other spelling of the same type
    priority: Priority = Priority.LOW,
) -> str:
    """Pick a mode."""
    return mode


def collections(
    tags: list[str],
    counts: dict[str, int],
    pair: tuple[int, str],
    ids: frozenset[int] = frozenset(),
) -> str:
    return ""


def moments(at: datetime, day: date, ref: UUID, amount: Decimal) -> str:
    return ""


def ship(to: Address, items: list[Item], express: bool = False) -> str:
    """Ship items.

    Args:
        to: Where to.
        items: What.
    """
    return ""


def ranged(
    n: Annotated[int, Field(ge=1, le=10, description="How many, from Field")],
    m: float = Field(1.5, description="A scale"),
    s: Annotated[str, Field(max_length=5)] = "ab",
    tags: list[str] = Field(default_factory=list),  # noqa: B008 - pydantic's way, as in pydantic-ai
) -> str:
    """Ranged values.

    Args:
        n: How many, from the docstring (Field wins).
        s: A short text.
    """
    return ""


def numpy_style(query: str, limit: int = 5) -> str:
    """Search, in NumPy's style.

    Parameters
    ----------
    query : str
        What to look for.
    limit : int, optional
        At most this many.

    Returns
    -------
    str
        The titles, one a line.
    """
    return ""


def sphinx_style(query: str, limit: int = 5) -> str:
    """Search, in Sphinx's style.

    :param query: What to look for.
    :param limit: At most this many.
    :returns: The titles.
    :rtype: str
    """
    return ""


def admonitions(query: str) -> str:
    """Search.

    Note:
        Results are cached for a minute.

    Raises:
        ValueError: never.

    Examples:
        >>> admonitions("x")
    """
    return ""


def keyword_only(*, a: int, b: str = "x") -> str:
    return ""


def positional_only(a: int, /, b: str) -> str:
    return ""


def variadic(first: str, *rest: int) -> str:
    return ""


def odd_names(json: str, model_config: int = 1, _hidden: bool = False, schema: str = "") -> str:
    return ""


def nested_plain(window: Window, where: Filter, point: Point, tree: Node) -> str:
    return ""


def one_dataclass(window: Window) -> str:
    return ""


def one_typed_dict(where: Filter) -> str:
    """Filter the catalogue."""
    return ""


def unannotated_args(a, b: int = 3):  # type: ignore[no-untyped-def]
    return ""


# (the kit's function, pydantic-ai's twin): the same but for the context's type.
SIGNATURES = [
    (search_catalog, search_catalog_pai),
    (renew_loan, renew_loan_pai),
    (scalars, scalars),
    (choices, choices),
    (collections, collections),
    (moments, moments),
    (ship, ship),
    (ranged, ranged),
    (numpy_style, numpy_style),
    (sphinx_style, sphinx_style),
    (admonitions, admonitions),
    (keyword_only, keyword_only),
    (positional_only, positional_only),
    (variadic, variadic),
    (odd_names, odd_names),
    (nested_plain, nested_plain),
    (one_dataclass, one_dataclass),
    (one_typed_dict, one_typed_dict),
    (unannotated_args, unannotated_args),
]


@pytest.mark.parametrize(("ours", "theirs"), SIGNATURES, ids=[s[0].__name__ for s in SIGNATURES])
def test_the_schema_and_descriptions_are_pydantic_ais(ours: Any, theirs: Any) -> None:
    made = tool(ours)
    twin = pydantic_ai.Tool(theirs).function_schema
    assert made.input_schema == twin.json_schema
    # (the same text too: key order included, as pydantic sorts it)
    assert json.dumps(made.input_schema) == json.dumps(twin.json_schema)
    assert made.description == (twin.description or "")


@pytest.mark.parametrize("fn", [s[0] for s in SIGNATURES], ids=[s[0].__name__ for s in SIGNATURES])
def test_testllm_makes_arguments_that_pass_from_each_schema(fn: Any) -> None:
    made = tool(fn)
    made.parse_arguments(
        arguments_for(made.input_schema, tool_name=made.name, validate=made.parse_arguments)
    )


def test_what_the_schema_of_a_search_says() -> None:
    made = tool(search_catalog)
    assert made.description == (
        "<summary>Search the library's catalogue.\n\nMatches titles and authors.</summary>\n"
        "<returns>\n<description>The matching titles.</description>\n</returns>"
    )
    assert made.input_schema == {
        "$defs": {"Genre": {"enum": ["fiction", "poetry"], "title": "Genre", "type": "string"}},
        "additionalProperties": False,
        "properties": {
            "query": {"description": "What to look for.", "type": "string"},
            "genre": {"$ref": "#/$defs/Genre", "description": "Only books of this genre."},
            "limit": {
                "default": 10,
                "description": "At most this many\ntitles.",
                "type": "integer",
            },
        },
        "required": ["query", "genre"],
        "type": "object",
    }


# -- docstrings: descriptions as pydantic-ai reads them -----------------------------------

DOCSTRINGS = {
    "one line": "Look something up.",
    "google, blank lines among the items": """Look up.

    Args:
        query: first.

        limit: second
            on two lines.

              and indented more.
    """,
    "google, a typed item and a description on the next line": """Look up.

    Args:
        query (str):
            On the next line.
        limit (int):   spaced out.
    """,
    "google, a returns type": """Look up.

    Returns:
        list[str]: The titles.
    """,
    "google, admonitions with titles": """Look up.

    Note: Mind the gap
        Careful.

    Important note:
        Very.

    Warnings:
        Slow.
    """,
    "google, a fenced block and text after the arguments": """Look up.

    ```
    Args:
        query: not this one
    ```

    Args:
        query: this one.
    Text after the arguments.
    """,
    "google, only arguments": """
    Args:
        query: the query.
    """,
    "numpy, notes and a named return": """Look up.

    Parameters
    ----------
    query, limit : str
        Both.

    Notes
    -----
    A note.

    Returns
    -------
    titles : list[str]
        The titles.
    """,
    "sphinx, continued fields": """Look up.

    Second paragraph.

    :param query: first
        continued.
    :param int limit: typed
    :returns: stuff
    :raises ValueError: never
    """,
}


def _with_doc(doc: str, returns: bool) -> Any:
    if returns:

        def look_up(query: str, limit: int = 3) -> str:
            return ""

    else:

        def look_up(query: str, limit: int = 3):  # type: ignore[no-untyped-def]
            return ""

    look_up.__doc__ = doc
    return look_up


@pytest.mark.parametrize("returns", [True, False])
@pytest.mark.parametrize("doc", list(DOCSTRINGS.values()), ids=list(DOCSTRINGS))
def test_docstrings_are_read_as_pydantic_ai_reads_them(doc: str, returns: bool) -> None:
    fn = _with_doc(doc, returns)
    made = tool(fn)
    twin = pydantic_ai.Tool(fn).function_schema
    assert made.input_schema == twin.json_schema
    assert made.description == (twin.description or "")


def test_the_description_given_is_kept_and_the_arguments_still_described() -> None:
    made = tool(description="Search it.")(search_catalog)
    assert made.description == "Search it."
    assert made.input_schema["properties"]["query"]["description"] == "What to look for."


# -- the model form and today's other forms are as they were ------------------------------


@tool
async def by_model(args: Address, ctx: ToolContext) -> str:
    """Store an address."""
    return f"{args.street} ({ctx.tool_name})"


@tool
async def by_model_ctx_first(ctx: ToolContext, args: Address) -> str:
    """Store an address."""
    return f"{args.street} ({ctx.tool_name})"


def test_the_model_form_keeps_the_models_own_schema() -> None:
    for made in (by_model, by_model_ctx_first):
        assert json.dumps(made.input_schema) == json.dumps(Address.model_json_schema())
        assert made.input_model is Address
        assert made.input_adapter is None
        assert made.description == "Store an address."
        assert made.parse_arguments({"street": "Rue"}) == Address(street="Rue")
    # pydantic-ai differs only by leaving out each property's title (and using the
    # model's docstring as the description when the function has none).
    theirs = pydantic_ai.Tool(by_model_pai).function_schema.json_schema
    ours = Address.model_json_schema()
    for value in ours["properties"].values():
        value.pop("title")
    assert theirs == ours


async def by_model_pai(args: Address) -> str:
    """Store an address."""
    return ""


def test_the_free_form_and_no_argument_forms_are_as_they_were() -> None:
    async def free(args: dict[str, Any], ctx: ToolContext) -> str:
        return str(sorted(args))

    async def untyped(args, ctx):  # type: ignore[no-untyped-def]
        return str(sorted(args))

    async def nothing() -> str:
        return "none"

    async def only_ctx(ctx: ToolContext) -> str:
        return ctx.tool_name

    for fn in (free, untyped, nothing, only_ctx):
        made = tool(fn)
        assert made.input_schema == {"type": "object", "properties": {}}
        assert (made.input_model, made.input_adapter) == (None, None)
        assert made.parse_arguments({"x": 1}) == {"x": 1}
    assert asyncio.run(tool(untyped).handler({"b": 1, "a": 2}, _ctx())) == "['a', 'b']"  # type: ignore[misc]


# -- the handler gets the values and the context ------------------------------------------


def _ctx(name: str = "t", deps: Any = None) -> ToolContext[Any]:
    return ToolContext("s", "call_1", name, "key", deps=deps)


def test_parse_arguments_checks_and_fills_in_the_values() -> None:
    made = tool(search_catalog)
    assert made.parse_arguments({"query": "dune", "genre": "fiction"}) == {
        "query": "dune",
        "genre": Genre.FICTION,
        "limit": 10,
    }
    with pytest.raises(ToolArgumentsError) as raised:
        made.parse_arguments({"query": "dune", "genre": "drama", "sort": "year"})
    said = str(raised.value)
    assert "genre: Input should be 'fiction' or 'poetry'" in said
    assert "sort: Extra inputs are not permitted" in said
    with pytest.raises(ToolArgumentsError, match="query: Field required"):
        made.parse_arguments({"genre": "fiction"})
    with pytest.raises(ToolArgumentsError, match="must be a JSON object"):
        made.parse_arguments(["dune"])


def test_each_kind_of_parameter_is_passed_as_it_is_declared() -> None:
    calls: list[Any] = []

    def everything(a: int, /, b: str, *rest: int, ctx: ToolContext, c: bool = True) -> str:
        calls.append((a, b, rest, ctx.tool_call_id, c))
        return "ok"

    made = tool(everything)
    assert made.input_schema["required"] == ["a", "b", "rest"]
    args = made.parse_arguments({"a": 1, "b": "x", "rest": [2, 3]})
    assert made.handler is not None
    assert made.handler(args, _ctx()) == "ok"
    assert calls == [(1, "x", (2, 3), "call_1", True)]


def test_a_single_dataclass_is_the_arguments_object_and_the_handler_gets_the_instance() -> None:
    def plan(ctx: ToolContext, window: Window) -> str:
        return f"{window.start.isoformat()}+{window.days}"

    made = tool(plan)
    assert made.input_schema["properties"]["days"] == {
        "default": 7,
        "description": "How many days.",
        "type": "integer",
    }
    args = made.parse_arguments({"start": "2030-01-02"})
    assert args == Window(date(2030, 1, 2))
    assert made.handler is not None
    assert made.handler(args, _ctx()) == "2030-01-02+7"
    # A type that refers to itself would not be an object at the top: it is an argument.
    assert tool(one_tree).input_schema["required"] == ["tree"]


@dataclass
class Tree:
    name: str
    children: list[Tree]


def one_tree(tree: Tree) -> str:
    return tree.name


def test_a_handler_given_later_gets_the_values_as_a_dict() -> None:
    seen: list[Any] = []

    async def fake(args: Any, ctx: ToolContext) -> str:
        seen.append(args)
        return "faked"

    made = tool(search_catalog).with_handler(fake)
    args = made.parse_arguments({"query": "q", "genre": "poetry", "limit": 2})
    assert made.handler is not None
    assert asyncio.run(made.handler(args, _ctx())) == "faked"
    assert seen == [{"query": "q", "genre": Genre.POETRY, "limit": 2}]


def _agent(*tools: Any) -> Agent[Any]:
    return Agent("loans", "Use the tools.", list(tools))


async def test_run_calls_the_handlers_with_the_values_and_the_context() -> None:
    calls = [
        ToolCall("c1", "search_catalog", {"query": "dune", "genre": "fiction", "limit": 2}),
        ToolCall("c2", "renew_loan", {"loan_id": "L1", "until": "2030-05-01"}),
    ]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="done")])
    agent = _agent(tool(search_catalog), tool(renew_loan))
    result = await run(agent, llm=llm, message="go", deps=Deps("central"))
    assert result.status == "complete", result.error
    contents = {m.tool_call_id: m.content for m in result.messages if m.role == "tool"}
    assert json.loads(contents["c1"]) == ["dune/fiction/2/central"]
    assert contents["c2"] == "L1 until 2030-05-01 (c2)"


async def test_invalid_arguments_are_an_invalid_arguments_result_and_nothing_runs() -> None:
    ran: list[str] = []

    async def renew(loan_id: str, until: datetime, ctx: ToolContext) -> str:
        ran.append(loan_id)
        return "renewed"

    calls = [ToolCall("c1", "renew", {"loan_id": 7, "until": "soon", "extra": True})]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="sorry")])
    result = await run(_agent(tool(renew)), llm=llm, message="renew it")
    assert result.status == "complete", result.error
    error = tool_error(next(m.content for m in result.messages if m.role == "tool"))
    assert error is not None
    assert error["kind"] == "invalid-arguments"
    assert error["error"].startswith("Tool 'renew' was not run: its arguments are invalid: ")
    for said in (
        "loan_id: Input should be a valid string",
        "until: Input should be a valid datetime",
        "extra: Extra inputs are not permitted",
    ):
        assert said in error["error"]
    assert ran == []


# -- check_agent and TestLLM with plain-parameter tools -----------------------------------


@tool(safe_to_retry=True)
async def find_books(
    ctx: ToolContext, query: str, genre: Genre = Genre.FICTION, limit: int = 3
) -> dict[str, Any]:
    """Find books.

    Args:
        query: What to look for.
        genre: Which shelf.
        limit: How many.
    """
    response = await ctx.deps.http.get(f"https://catalog.example/search?q={query}")
    return {"status": response.status_code, "limit": limit}


@tool
async def send_reminder(
    to: Annotated[str, Field(pattern=r"^[a-z]+@[a-z]+\.example$")],
    loan: Item,
    when: datetime,
    ctx: ToolContext,
    note: str | None = None,
) -> dict[str, Any]:
    """Email a reminder (a side effect, keyed)."""
    response = await ctx.deps.http.post(
        "https://mail.example/send",
        json={"to": to, "sku": loan.sku, "at": when.isoformat()},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return {"status": response.status_code}


@tool(requires_approval=True)
def waive_fee(loan_id: str, amount: Annotated[int, Field(ge=1, le=50)], ctx: ToolContext) -> str:
    """Waive a late fee (a sync handler that needs a person's approval)."""
    return f"waived {amount} on {loan_id} ({ctx.tool_call_id})"


def test_check_agent_passes_on_an_agent_of_plain_parameter_tools() -> None:
    module = ModuleType("plain_parameter_agent")
    module.AGENT = _agent(find_books, send_reminder, waive_fee)  # type: ignore[attr-defined]
    module.make_deps = lambda env, http: SimpleNamespace(http=http)  # type: ignore[attr-defined]
    report = check_agent(module, config=None, turns=1)
    assert report.safe_tools == ("find_books",)
    assert set(report.unsafe_tools) == {"send_reminder", "waive_fee"}
    assert report.approval_tools == ("waive_fee",)
    assert report.approved > report.edited > 0
    assert report.requests > 0
    assert report.unkeyed_unsafe_requests == ()


# -- what cannot be a tool: said plainly, naming the tool ---------------------------------


def test_unsupported_signatures_are_a_clear_configuration_error() -> None:
    def with_kwargs(query: str, **more: str) -> str:
        return ""

    def two_contexts(a: ToolContext, b: ToolContext[int], query: str) -> str:
        return ""

    def run_context(ctx: RunContext, query: str) -> str:
        return ""

    def variadic_context(query: str, *ctx: ToolContext) -> str:
        return ""

    def unschemable(query: str, client: httpx.AsyncClient) -> str:
        return ""

    cases = [
        (with_kwargs, r"tool 'with_kwargs': a handler cannot take \*\*more"),
        (two_contexts, r"tool 'two_contexts': more than one parameter is a ToolContext \(a, b\)"),
        (run_context, r"tool 'run_context': parameter 'ctx' is a RunContext"),
        (variadic_context, r"tool 'variadic_context': the ToolContext cannot be a variadic"),
        (unschemable, r"tool 'unschemable': pydantic cannot make a schema of its parameters"),
    ]
    for fn, said in cases:
        with pytest.raises(ConfigurationError, match=said):
            tool(fn)


def test_a_name_that_does_not_resolve_is_said_with_the_tool() -> None:
    class Local(BaseModel):  # not at module level: `Local` is a string nothing resolves
        x: int

    def uses_local(item: Local, count: int) -> str:
        return ""

    with pytest.raises(ConfigurationError, match=r"tool 'uses_local': cannot resolve"):
        tool(uses_local)


def test_the_kit_never_imports_pydantic_ai_or_griffe() -> None:
    imports = re.compile(r"^\s*(?:from|import)\s+(?:pydantic_ai|griffe)\b", re.MULTILINE)
    for path in SRC.rglob("*.py"):
        assert imports.search(path.read_text()) is None, path


def test_a_naive_datetime_and_an_aware_one_both_arrive_as_datetimes() -> None:
    made = tool(moments)
    args = made.parse_arguments(
        {
            "at": "2030-01-01T10:00:00Z",
            "day": "2030-01-01",
            "ref": "12345678-1234-5678-1234-567812345678",
            "amount": "1.50",
        }
    )
    assert args["at"] == datetime(2030, 1, 1, 10, tzinfo=UTC)
    assert args["amount"] == Decimal("1.50")
