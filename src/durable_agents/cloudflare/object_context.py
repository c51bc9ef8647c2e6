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
from ..budget import InvocationBudget
from ..llm.base import LLM
from ..stores.base import Store
from .agent_module import MakeDeps, MakeLLM
from .alarms import ObjectAlarm
from .commands import Command
from .config import SessionIndex
from .live import LiveSession
from .wire import Reply

__all__ = ["CommandT", "ObjectContext", "ObjectHandler"]


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


CommandT = TypeVar("CommandT", bound=Command)
ObjectHandler = Callable[[CommandT, ObjectContext], Awaitable[Reply]]
