"""The size limits the run loop, the agent and every store share.

    MAX_ROW_BYTES   1,900,000  the largest message a store keeps (its content
                               plus its tool calls as JSON). D1 refuses rows
                               over 2,000,000 bytes; the same bound on every
                               backend keeps them interchangeable (a history
                               that fits SQLite fits D1). `Agent`'s
                               `max_result_bytes` and `max_message_bytes`
                               may not exceed it.
    MAX_JSON_DEPTH  128        how deep JSON from outside may nest (request
                               bodies, LLM replies, tool arguments and
                               results, upstream responses); refused before
                               parsing, see `durable_agents._json`.
    MAX_BOUND_INT   2**53 - 2  the largest integer a store binds: D1 and the
                               Durable Object's SQL hold integers as JS
                               numbers (tests/cloudflare/test_workerd_behaviour.py
                               measures it); every position, limit and time a
                               request names is kept within it.

A module of its own, importing nothing, so the core (agent, run loop), the
stores and the Cloudflare side read one number without importing each other.
"""

from __future__ import annotations

__all__ = ["MAX_BOUND_INT", "MAX_JSON_DEPTH", "MAX_ROW_BYTES"]

MAX_ROW_BYTES = 1_900_000
MAX_JSON_DEPTH = 128
MAX_BOUND_INT = 2**53 - 2
