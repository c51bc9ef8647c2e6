"""The Worker's settings, read from its env: the API's own, where sessions are stored,
the invocation budget, the agent's token limits, the tools' HTTP client.

What each setting means is in docs/configuration.md; the API's (`API_TOKEN`,
`MAX_BODY_BYTES`, `SESSION_TOKEN_SECRET`) in docs/http-api.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from .._http.client import default_client
from ..agent import Agent
from ..budget import PLANS, InvocationBudget
from ..errors import ConfigurationError
from ..llm.settings import setting
from ..stores.base import SessionInfo, Store
from .tokens import check_secret

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "HTTP_TIMEOUT_S",
    "SESSION_STORES",
    "ApiSettings",
    "SessionIndex",
    "plan_budget",
    "session_store_kind",
    "session_stores",
    "tools_client",
    "with_budget",
]

DEFAULT_MAX_BODY_BYTES = 64 * 1024
HTTP_TIMEOUT_S = 30.0
SESSION_STORES = ("d1", "durable-object")


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """The API's own settings, read from the Worker's env by `from_env`."""

    api_token: str | None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    session_token_secret: str | None = None

    @classmethod
    def from_env(cls, env: Any) -> ApiSettings:
        """Raises ConfigurationError for a MAX_BODY_BYTES that is not a positive integer."""
        token = setting(env, "API_TOKEN")
        raw_limit = setting(env, "MAX_BODY_BYTES")
        limit = DEFAULT_MAX_BODY_BYTES
        if raw_limit is not None:
            try:
                limit = int(str(raw_limit))
            except ValueError:
                limit = 0
            if limit < 1:
                raise ConfigurationError(
                    f"MAX_BODY_BYTES must be a positive integer (bytes), got {raw_limit!r}"
                )
        secret = setting(env, "SESSION_TOKEN_SECRET")
        if secret is not None:
            try:
                check_secret(str(secret))
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        return cls(
            None if token is None else str(token), limit, None if secret is None else str(secret)
        )


class SessionIndex(Protocol):
    """Where sessions kept in a Durable Object are listed (the Worker's D1 store)."""

    async def put_session_summary(self, info: SessionInfo) -> None: ...

    async def delete_session(self, session_id: str) -> bool: ...

    async def idle_sessions(self, before_ms: int, *, limit: int = 100) -> list[SessionInfo]: ...


def session_store_kind(env: Any) -> str:
    """The setting `SESSION_STORE`: "d1" (the default) or "durable-object"."""
    raw = setting(env, "SESSION_STORE")
    kind = "d1" if raw is None or str(raw).strip() == "" else str(raw).strip()
    if kind not in SESSION_STORES:
        raise ConfigurationError(
            f"SESSION_STORE must be one of {', '.join(SESSION_STORES)}, got {raw!r}"
        )
    return kind


def session_stores(env: Any, storage: Any) -> tuple[Store, SessionIndex | None]:
    """A session object's store and index, per `SESSION_STORE`: D1 and no index, or its
    own SQLite (`storage`, the object's `ctx.storage`) with D1 as the index."""
    from ..stores.d1 import d1_store
    from ..stores.durable_object import durable_object_store

    d1 = d1_store(env.DB)
    if session_store_kind(env) == "durable-object":
        return durable_object_store(storage), d1
    return d1, None


def plan_budget(env: Any) -> InvocationBudget:
    """A fresh budget for one invocation, per the setting WORKERS_PLAN (free, the
    default, or paid)."""
    raw = setting(env, "WORKERS_PLAN")
    plan = "free" if raw is None or str(raw).strip() == "" else str(raw).strip()
    if plan not in PLANS:
        raise ConfigurationError(f"WORKERS_PLAN must be free or paid, got {raw!r}")
    return InvocationBudget.for_plan(plan)


def with_budget(agent: Agent, env: Any) -> Agent:
    """`agent` with the Worker's `MAX_SESSION_TOKENS` and `MAX_CONTEXT_TOKENS` settings as
    its `max_session_tokens` and `max_context_tokens`, when set (they win over the
    agent's own)."""
    changes: dict[str, Any] = {}
    for name, field_name in (
        ("MAX_SESSION_TOKENS", "max_session_tokens"), ("MAX_CONTEXT_TOKENS", "max_context_tokens"),
    ):  # fmt: skip
        raw = setting(env, name)
        if raw is None or str(raw).strip() == "":
            continue
        text = str(raw).strip()
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            raise ConfigurationError(f"{name} must be a positive integer, got {raw!r}")
        changes[field_name] = int(text)
    return dataclasses.replace(agent, **changes) if changes else agent


def tools_client(timeout: float = HTTP_TIMEOUT_S) -> httpx.AsyncClient:
    """The `http` a Worker hands `make_deps`: the kit's default client (`_http.client`),
    over the runtime's `fetch` inside a Worker (this package makes it the default there),
    httpx's own transport on CPython; JSON nested past 128 levels is refused when read."""
    return default_client(timeout)
