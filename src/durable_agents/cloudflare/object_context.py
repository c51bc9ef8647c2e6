"""What a session's Durable Object has at hand while it serves one command.

`serve_session` (session_object.py) builds one `ObjectContext` per command and
hands it to the command's handler (turns.py, reads.py, schedules_api.py); the
parts are described in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from ..agent import Agent
from ..agent_tools import AgentRunner
from ..budget import InvocationBudget
from ..llm.base import LLM
from ..stores.base import Store
from .agent_module import MakeDeps, MakeLLM
from .alarms import ObjectAlarm
from .commands import Command
from .config import SessionIndex
from .live import LiveSession
from .wire import Reply

__all__ = ["HANDLERS", "CommandT", "ObjectContext", "ObjectHandler", "handles"]


@dataclass(frozen=True, slots=True)
class ObjectContext:
    """One session object's state and wiring, as `serve_session` was given them."""

    session_id: str
    store: Store
    env: Any
    live: LiveSession
    agent: Agent
    make_deps: MakeDeps
    make_llm: MakeLLM
    llm: LLM | None = None
    http_client: httpx.AsyncClient | None = None
    keep_alive: Callable[[asyncio.Task[Any]], None] | None = None
    index: SessionIndex | None = None
    alarm: ObjectAlarm | None = None
    budget: InvocationBudget | None = None
    settings: Sequence[str] = ()
    agents: AgentRunner | None = None  # who runs its agent tools' child turns


CommandT = TypeVar("CommandT", bound=Command)
ObjectHandler = Callable[[CommandT, ObjectContext], Awaitable[Reply]]

# The object's handler of each command, filled by `@handles` where the handlers live
# (turns.py, reads.py, schedules_api.py, session_object.py).
HANDLERS: dict[type[Command], ObjectHandler[Any]] = {}


HandlerT = TypeVar("HandlerT", bound=Callable[..., Awaitable[Reply]])


def handles(*commands: type[Command]) -> Callable[[HandlerT], HandlerT]:
    """Make the decorated function the object's handler of `commands`."""

    def register(handler: HandlerT) -> HandlerT:
        for command in commands:
            if command in HANDLERS:
                raise ValueError(f"{command.__name__} has a handler already")
            HANDLERS[command] = handler
        return handler

    return register
