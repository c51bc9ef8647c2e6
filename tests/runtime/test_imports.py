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
