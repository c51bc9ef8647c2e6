"""The vendored packages and the library import and work inside Pyodide."""

import sys


def test_vendored_packages_import():
    import annotated_types
    import httpx
    import pydantic
    import pydantic_core
    import workers

    import durable_agents

    assert sys.platform == "emscripten"
    assert sys.version_info[:2] == (3, 14)
    assert pydantic.VERSION.startswith("2.")
    assert pydantic.version.check_pydantic_core_version(), pydantic_core.__version__
    assert httpx.__version__
    assert workers.WorkerEntrypoint
    assert workers.DurableObject
    assert annotated_types.Gt(1).gt == 1
    assert durable_agents.__name__ == "durable_agents"


def test_pydantic_validates_and_builds_schemas():
    import pydantic

    class Order(pydantic.BaseModel):
        sku: str
        quantity: pydantic.PositiveInt = 1

    assert Order.model_validate({"sku": "a", "quantity": "3"}).quantity == 3
    errors = []
    try:
        Order(sku="a", quantity=0)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
    assert [e["type"] for e in errors] == ["greater_than"]
    assert Order.model_json_schema()["required"] == ["sku"]


def test_a_tool_made_from_plain_parameters_reads_its_signature_here():
    """Python 3.14's annotations, Pyodide's pydantic and typing_extensions: the same
    schema as on CPython (tests/test_tool_parameters.py compares it with pydantic-ai's)."""
    from typing import Annotated

    from pydantic import Field

    from durable_agents import ToolArgumentsError, ToolContext, tool

    def renew_loan(
        loan_id: str, days: Annotated[int, Field(ge=1, le=28)], ctx: ToolContext, note: str = ""
    ) -> str:
        """Renew a loan.

        Args:
            loan_id: The loan.
            days: How many more days.
        """
        return f"{loan_id}+{days}{note} ({ctx.tool_call_id})"

    made = tool(renew_loan)
    assert made.description == "Renew a loan."
    assert made.input_schema == {
        "additionalProperties": False,
        "properties": {
            "loan_id": {"description": "The loan.", "type": "string"},
            "days": {
                "description": "How many more days.",
                "maximum": 28,
                "minimum": 1,
                "type": "integer",
            },
            "note": {"default": "", "type": "string"},
        },
        "required": ["loan_id", "days"],
        "type": "object",
    }
    args = made.parse_arguments({"loan_id": "L1", "days": "14"})
    assert made.handler(args, ToolContext("s", "c1", "renew_loan", "k")) == "L1+14 (c1)"
    said = ""
    try:
        made.parse_arguments({"loan_id": "L1", "days": 99, "more": 1})
    except ToolArgumentsError as exc:
        said = str(exc)
    assert "days: Input should be less than or equal to 28" in said
    assert "more: Extra inputs are not permitted" in said
