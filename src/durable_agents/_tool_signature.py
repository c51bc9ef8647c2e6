"""How `@tool` reads a handler's signature (docs/python-api.md, "Tools"): which parameter
gets the `ToolContext`, what the model sends for the others, and how the handler is
called with what was checked.

The model sends, by the parameters besides the context:

- none: no arguments (`{"type": "object", "properties": {}}`);
- one annotated with a pydantic model: that model's own schema (the model form, as it
  always was); the handler gets the instance;
- one that is a dataclass or a TypedDict: its schema, as pydantic-ai makes it;
- one unannotated, `dict` or `Any`: an object the handler gets as sent;
- otherwise one argument per parameter: the JSON schema pydantic-ai builds from the
  signature (`pydantic_ai.Tool(fn).function_schema.json_schema`), the descriptions from
  the docstring (`_docstrings`), checked by pydantic; the handler gets the values.

Only pydantic and the standard library: it runs in the Worker.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired, cast, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from typing_extensions import TypedDict, is_typeddict

from ._docstrings import describe
from .errors import ConfigurationError

Call = Callable[[Any, Any], Any]
"""The tool's handler as the run loop calls it: `(what parse_arguments made, ctx)`."""

_DEFS = "#/$defs/"
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass(frozen=True)
class Reading:
    """What a handler's signature makes of its tool."""

    schema: dict[str, Any]
    model: type[BaseModel] | None  # the model form's model
    adapter: TypeAdapter[Any] | None  # what checks the arguments of the other typed forms
    call: Call
    description: str | None  # from the docstring; None: the docstring as written
    returns: Any  # the return annotation, None without one


class _ToolJsonSchema(GenerateJsonSchema):
    """pydantic's JSON schema without each property's title, as pydantic-ai writes a
    tool's (the titles only repeat the names)."""

    def _named_required_fields_schema(
        self, named_required_fields: Sequence[tuple[str, bool, Any]]
    ) -> JsonSchemaValue:
        schema = super()._named_required_fields_schema(named_required_fields)
        for value in schema.get("properties", {}).values():
            value.pop("title", None)
        return schema


def input_schema(
    name: str, spec: type[BaseModel] | dict[str, Any] | Any
) -> tuple[type[BaseModel] | None, dict[str, Any]]:
    """The model and schema of `tool(input=spec)` and of a handler's one model parameter."""
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        return spec, spec.model_json_schema()
    if _takes_the_object(spec) or spec == {}:
        return None, {"type": "object", "properties": {}}
    if isinstance(spec, dict):
        if spec.get("type", "object") != "object":
            raise ConfigurationError(f"tool {name!r}: the input schema must describe an object")
        return None, {"type": "object", **spec}
    raise ConfigurationError(
        f"tool {name!r}: input must be a pydantic model or a JSON-schema dict, got {spec!r}"
    )


def read_signature(
    tool_name: str, fn: Callable[..., Any], *, context: type, run_context: type
) -> Reading:
    """What `fn`'s signature makes of tool `tool_name`; ConfigurationError for one it
    cannot take. `context` is the ToolContext class (`run_context` the class a handler
    must not ask for)."""
    params = list(inspect.signature(fn).parameters.values())
    hints = _type_hints(tool_name, fn)
    bare = {name: _bare(hint) for name, hint in hints.items()}
    ctx = _context_parameter(tool_name, params, bare, context, run_context)
    values = [p for p in params if p is not ctx]
    for p in values:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            raise ConfigurationError(
                f"tool {tool_name!r}: a handler cannot take **{p.name}: name each argument "
                "the model may send as a parameter"
            )
    returns = bare.get("return")
    if not values or (len(values) == 1 and values[0].kind not in _VARIADIC):
        one = bare.get(values[0].name) if values else None
        if not values or _takes_the_object(one) or _is_model(one):
            model, schema = input_schema(tool_name, one if values else {})
            return Reading(schema, model, None, _caller(fn, params, ctx, whole=True), None, returns)
        if dataclasses.is_dataclass(one) or is_typeddict(one):
            call = _caller(fn, params, ctx, whole=True)
            single = _single_parameter(tool_name, fn, values[0].name, one, call, hints)
            if single is not None:
                return single
    return _plain_parameters(tool_name, fn, params, ctx, hints, returns)


def _type_hints(tool_name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise ConfigurationError(
            f"tool {tool_name!r}: cannot resolve its annotations ({exc}); define the models "
            "it names at module level"
        ) from None


def _bare(hint: Any) -> Any:
    """`hint` without `Annotated[...]`'s metadata."""
    return get_args(hint)[0] if get_origin(hint) is Annotated else hint


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)


def _takes_the_object(hint: Any) -> bool:
    """An unannotated, `Any` or `dict` parameter: it gets the arguments object as sent."""
    return hint is None or hint is Any or hint is dict or get_origin(hint) is dict


def _is_a(hint: Any, cls: type) -> bool:
    return hint is cls or get_origin(hint) is cls


def _context_parameter(
    tool_name: str,
    params: list[inspect.Parameter],
    bare: dict[str, Any],
    context: type,
    run_context: type,
) -> inspect.Parameter | None:
    """The parameter that gets the ToolContext: the one annotated with it; else one named
    `ctx` without an annotation; else the second of `(args, ctx)` (unannotated or `Any`),
    the form handlers took before plain parameters."""
    annotated = _annotated_context(tool_name, params, bare, context, run_context)
    if annotated is not None:
        return annotated
    for p in params:
        if p.name == "ctx" and p.name not in bare and p.kind not in _VARIADIC:
            return p
    if len(params) == 2 and all(p.kind in _POSITIONAL for p in params):
        first, second = (bare.get(p.name) for p in params)
        if (_takes_the_object(first) or _is_model(first)) and (second is None or second is Any):
            return params[1]
    return None


def _annotated_context(
    tool_name: str,
    params: list[inspect.Parameter],
    bare: dict[str, Any],
    context: type,
    run_context: type,
) -> inspect.Parameter | None:
    for p in params:
        if _is_a(bare.get(p.name), run_context):
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {p.name!r} is a RunContext, which instructions "
                "and toolsets get; a tool's handler takes `ctx: ToolContext`"
            )
    annotated = [p for p in params if _is_a(bare.get(p.name), context)]
    if len(annotated) > 1:
        names = ", ".join(p.name for p in annotated)
        raise ConfigurationError(
            f"tool {tool_name!r}: more than one parameter is a ToolContext ({names}); "
            "a handler takes one"
        )
    if annotated and annotated[0].kind in _VARIADIC:
        raise ConfigurationError(
            f"tool {tool_name!r}: the ToolContext cannot be a variadic parameter "
            f"({annotated[0].name})"
        )
    return annotated[0] if annotated else None


def _caller(
    fn: Callable[..., Any],
    params: list[inspect.Parameter],
    ctx: inspect.Parameter | None,
    *,
    whole: bool,
) -> Call:
    """How the run loop calls `fn`: the context where `ctx` is, and the arguments as
    parsed (`whole`) or each parameter's value from the dict parse_arguments made."""
    plan = [(p.name, p.kind, p is ctx) for p in params]
    if whole and [(kind in _POSITIONAL, is_ctx) for _, kind, is_ctx in plan] == [
        (True, False),
        (True, True),
    ]:
        return fn  # (args, ctx), as the run loop calls it: `Tool.handler` is the function

    def call(args: Any, context: Any) -> Any:
        positional: list[Any] = []
        named: dict[str, Any] = {}
        for name, kind, is_context in plan:
            value = context if is_context else args if whole else args[name]
            if kind is inspect.Parameter.VAR_POSITIONAL:
                positional.extend(value)
            elif kind is inspect.Parameter.KEYWORD_ONLY:
                named[name] = value
            else:
                positional.append(value)
        return fn(*positional, **named)

    return call


def _schema_of(tool_name: str, typed_dict: Any) -> tuple[TypeAdapter[Any], dict[str, Any]]:
    # As pydantic-ai's tool schema: attribute docstrings describe the fields of the
    # dataclasses and TypedDicts the parameters name (their own config aside).
    typed_dict.__pydantic_config__ = ConfigDict(use_attribute_docstrings=True)
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(typed_dict)
        schema = adapter.json_schema(schema_generator=_ToolJsonSchema)
    except PydanticUserError as exc:
        raise ConfigurationError(
            f"tool {tool_name!r}: pydantic cannot make a schema of its parameters: {exc}"
        ) from None
    return adapter, schema


def _plain_parameters(
    tool_name: str,
    fn: Callable[..., Any],
    params: list[inspect.Parameter],
    ctx: inspect.Parameter | None,
    hints: dict[str, Any],
    returns: Any,
) -> Reading:
    description, said = describe(fn.__doc__, has_return_annotation="return" in hints)
    fields = {
        p.name: _field(p, hints.get(p.name, Any), said.get(p.name)) for p in params if p is not ctx
    }
    make_typed_dict = cast(Any, TypedDict)
    adapter, schema = _schema_of(tool_name, make_typed_dict(fn.__name__, fields, closed=True))
    schema.pop("title", None)
    if schema.get("additionalProperties") is not False:
        raise ConfigurationError(
            f"tool {tool_name!r}: this pydantic does not close a TypedDict (PEP 728), so it "
            "would let the model send arguments the handler does not take; upgrade pydantic"
        )
    call = _caller(fn, params, ctx, whole=False)
    return Reading(schema, None, adapter, call, description, returns)


def _field(p: inspect.Parameter, hint: Any, said: str | None) -> Any:
    """The TypedDict item for parameter `p`: its type, its default, its description."""
    if p.kind is inspect.Parameter.VAR_POSITIONAL:
        hint = list[hint]
    default = p.default
    has_default = default is not inspect.Parameter.empty
    info = (
        FieldInfo.from_annotated_attribute(hint, default)
        if has_default
        else FieldInfo.from_annotation(hint)
    )
    # `= Field(description=...)` without a default is required, as pydantic reads it
    required = not has_default or (isinstance(default, FieldInfo) and default.is_required())
    metadata: list[Any] = []
    if has_default:
        metadata.append(default if isinstance(default, FieldInfo) else Field(default=default))
    if info.description is None and said is not None:
        metadata.append(Field(description=said))
    item = cast(Any, Annotated)[(hint, *metadata)] if metadata else hint
    return item if required else cast(Any, NotRequired)[item]


def _single_parameter(
    tool_name: str,
    fn: Callable[..., Any],
    name: str,
    hint: Any,
    call: Call,
    hints: dict[str, Any],
) -> Reading | None:
    """One dataclass or TypedDict parameter: its own schema (not under its name), as
    pydantic-ai makes it; None when that would not be an object at the top (a type that
    refers to itself), which the plain form then takes."""
    make_typed_dict = cast(Any, TypedDict)
    _, whole = _schema_of(tool_name, make_typed_dict(fn.__name__, {name: hint}))
    schema = _unwrapped(whole, name)
    if schema is None:
        return None
    description, _ = describe(fn.__doc__, has_return_annotation="return" in hints)
    if not description:  # pydantic-ai: the type's own description describes the tool
        description = schema.pop("description", None)
    adapter: TypeAdapter[Any] = TypeAdapter(hint)
    return Reading(schema, None, adapter, call, description, _bare(hints.get("return")))


def _unwrapped(whole: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The schema of property `name` of `whole`, standing alone: its definition brought up
    to the top, the other definitions kept."""
    prop = whole["properties"][name]
    ref = prop.get("$ref")
    if len(prop) != 1 or not isinstance(ref, str) or not ref.startswith(_DEFS):
        return None
    defs: dict[str, Any] = whole.get("$defs", {})
    target = defs[ref[len(_DEFS) :]]
    rest = {key: value for key, value in defs.items() if value is not target}
    if _refers_to(target, ref) or _refers_to(rest, ref):
        return None
    return {"$defs": rest, **target} if rest else dict(target)


def _refers_to(node: Any, ref: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == ref or any(_refers_to(v, ref) for v in node.values())
    if isinstance(node, list):
        return any(_refers_to(v, ref) for v in node)
    return False
