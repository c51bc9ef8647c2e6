"""The JSON Schema work the kit does itself: checking a value against a schema, and
making values that fit one (the arguments `TestLLM` calls tools with).

    check.py         `schema_problems` (the one check) and `json_type`
    values.py        `example_arguments`: values made from a schema, checked
    formats.py       the string formats: a valid value of each, and the test
    regex_sample.py  example strings for a `pattern`

Core, not the testing kit: `Tool.parse_arguments` checks schema-only tools'
arguments with it, and `TestLLM` (which makes the values) is also the Worker's
offline "demo" model, so it ships in the Worker. Guides: docs/testing.md
(what `TestLLM` fills in), docs/mcp.md (tools whose schema is all there is).
"""
