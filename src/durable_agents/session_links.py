"""Links between a parent's agent-tool call and the child session it ran, both ways:
what the timeline page (`durable_agents.timeline`) and `durable-agents sessions show`
link and list. The guide: docs/python-api.md (Agents as tools).

Parent to child needs no record: a call's child session is named
`child_session_name(parent session id, call id)`, so a call links to it when a
session of that name is stored (whichever tool made it). Child to parent is the
record the child's first write keeps (`Message.parent_call`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ._child_sessions import child_session_name
from ._turn.delegation import AgentToolHandler
from .agent import Agent
from .messages import Message
from .stores.base import Store

__all__ = ["LinkedSession", "SessionLinks", "agent_tool_agents", "find_links", "view_href"]

Href = Callable[[str, str | None], str]
"""How a page links to a session: (its name, its agent's served name or None for the
default agent) -> href. `view_href` for the Worker's pages."""


def view_href(name: str, agent: str | None = None) -> str:
    """The Worker's URL of a session's timeline page: `/sessions/{name}/view` for the
    default agent's, `/agents/{agent}/sessions/{name}/view` for another served agent's."""
    where = f"/sessions/{quote(name, safe='')}/view"
    return where if agent is None else f"/agents/{quote(agent, safe='')}{where}"


@dataclass(frozen=True, slots=True)
class LinkedSession:
    """A session linked from another: its id and name, the call that links the two (the
    parent's agent-tool call), and where its page is (`href`; None when its session is
    not stored where the page was read)."""

    session_id: str
    name: str
    call_id: str
    href: str | None = None


@dataclass(frozen=True, slots=True)
class SessionLinks:
    """What a session links to: `parent`, the session whose call its turn answers (None
    for a session no agent tool started); `children`, by the parent's call id, the child
    session each of its agent-tool calls ran."""

    parent: LinkedSession | None = None
    children: Mapping[str, LinkedSession] = field(default_factory=dict)


async def find_links(
    store: Store,
    session_id: str,
    messages: Iterable[Message],
    *,
    href: Href = view_href,
    agents: Mapping[str, str] | None = None,
    parent_agent: str | None = None,
    served_agent: Callable[[str | None], str | None] | None = None,
) -> SessionLinks:
    """The links of session `session_id`, of which `messages` are the ones shown: a child
    for each of their calls whose child session `store` holds, and the parent call its
    first message records (`Message.parent_call`: a child session's turn is its first),
    with the parent's name if `store` holds it.

    One lookup per call: `agents` (tool name -> the served name of the agent it runs,
    `agent_tool_agents`) limits them to those tools' calls, as the Worker's page does
    within its invocation's budget; None looks every call up (the CLI). They and
    `parent_agent` are the links' agent segment (`href`'s second argument; None: the
    default agent's URL); `served_agent`, when given, finds the parent's instead, from
    the `agent_name` its session is stored with (a Worker serving several agents).
    """
    children: dict[str, LinkedSession] = {}
    for message in messages:
        for call in message.tool_calls:
            if agents is not None and call.name not in agents:
                continue
            name = child_session_name(session_id, call.id)
            found = await store.find_sessions(name)
            if found:
                agent = (agents or {}).get(call.name)
                children[call.id] = LinkedSession(found[0].id, name, call.id, href(name, agent))
    first = await store.load_messages(session_id, limit=1)
    recorded = first[0].parent_call if first else None
    parent = None
    if recorded is not None:
        info = await store.get_session(recorded.session_id)
        name = recorded.session_id if info is None else info.name or info.id
        if info is not None and served_agent is not None:
            parent_agent = served_agent(info.agent_name)
        where = None if info is None else href(name, parent_agent)
        parent = LinkedSession(recorded.session_id, name, recorded.call_id, where)
    return SessionLinks(parent, children)


def agent_tool_agents(agent: Agent[Any, Any]) -> dict[str, str]:
    """The agent each of `agent`'s agent tools runs, by tool name: `find_links(agents=)`
    for the agent whose page it is."""
    return {
        t.name: handler.agent
        for t in agent.tools
        if isinstance(handler := t.handler, AgentToolHandler)
    }
