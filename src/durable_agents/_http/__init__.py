"""The kit's HTTP plumbing, shared by every layer that talks HTTP: the LLM adapters
(`llm/`), `MCPTools` (`mcp.py`), the Worker (`cloudflare/`) and the testing kit.

    client.py      `default_client`: the httpx client the kit builds when none is
                   given, sending through the default transport (`fetch` in a Worker)
    json_guard.py  `refuse_deep_json`: the response hook that refuses JSON nested
                   too deep before anything parses it
    sse.py         server-sent events read from a body: `sse_lines`, `sse_events`

What is particular to one user stays with it (the LLM adapters' retries and
error mapping in `llm/`, MCP's JSON-RPC in `mcp.py`). Core: imports nothing
but `_json` and `errors`. Guides: docs/llm-providers.md, docs/mcp.md.
"""
