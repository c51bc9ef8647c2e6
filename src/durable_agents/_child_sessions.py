"""Where an agent tool's call runs its child's turn: the child session's name, and finding it.

The name is derived from the parent's session and call, so a call run again after a
crash finds the same session, and anything holding a parent's stored call (listing
its approvals, deciding one, resuming its turn) finds the child without knowing which
tools are agent tools. Its own module because both the run loop's delegation
(`_turn.delegation`) and the approvals (`durable_agents.approvals`) need it, and
neither may import the other. The guide: docs/python-api.md (Agents as tools).
"""

from __future__ import annotations

import hashlib

from .stores.base import Store

__all__ = ["child_session_id", "child_session_name"]


def child_session_name(parent_session_id: str, call_id: str) -> str:
    """The name of the session a parent's agent-tool call runs its child turn in: stable
    for the call (a re-invocation after a crash finds the same session), distinct across
    calls, and a valid session name (`sub-` and 40 hex digits)."""
    digest = hashlib.sha256(f"{parent_session_id}/{call_id}".encode()).hexdigest()
    return f"sub-{digest[:40]}"


async def child_session_id(store: Store, parent_session_id: str, call_id: str) -> str | None:
    """The id of the session the call's child turn ran in, if it ran one in `store` (None
    for any other call, or an agent tool's whose child has not started). On a durable
    store it is the name; a memory store gives the child a new id under that name."""
    found = await store.find_sessions(child_session_name(parent_session_id, call_id))
    return found[0].id if found else None
