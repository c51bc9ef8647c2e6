"""The machinery of the route table: a `Route` (method, path template, handler, who may
call it), the `Request` a handler gets, and the 404/405/400/403 the table itself answers.

The table is in `routes.py`; the routes, as clients see them, in docs/http-api.md.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from ..stores.base import Store
from .auth import MASTER, Grant, forbidden
from .bodies import Body, BodyReader, body_of, read_json
from .commands import SESSION_NAME, Command
from .config import ApiSettings
from .wire import Reply, error_reply, internal_error

__all__ = [
    "API_TOKEN", "SESSION_TOKEN", "Dispatch", "Request", "Route", "forwarding", "route_for",
]  # fmt: skip

Dispatch = Callable[[str, Command], Awaitable[Reply]]
Access = Literal["api-token", "session-token"]
API_TOKEN: Access = "api-token"  # the API token only
SESSION_TOKEN: Access = "session-token"  # also a session token, on its own session
BodyT = TypeVar("BodyT", bound=Body)


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a handler sees it: authorized, routed, its path's `params` taken."""

    method: str
    path: str
    params: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes | BodyReader
    query: str
    settings: ApiSettings
    now: float  # Unix seconds, read once
    dispatch: Dispatch
    sessions: Callable[[], Store] | None = None
    agent: str | None = None  # the served agent of /agents/{agent}/...; None: the default
    agent_name: str | None = None  # its AGENT.name (what the sessions table holds)

    @property
    def name(self) -> str:
        """The session name of a /sessions/{name}/... route, checked by the table."""
        return self.params["name"]

    @property
    def stream(self) -> bool:
        """Whether the client asked for server-sent events."""
        return "text/event-stream" in self.headers.get("accept", "").lower()

    async def json_body(self, model: type[BodyT], *, required: bool) -> BodyT | Reply:
        """The body as a `model`, or the 4xx that says why it is not one."""
        data = await read_json(
            self.headers, self.body, self.settings.max_body_bytes, required=required
        )
        return data if isinstance(data, Reply) else body_of(model, data)

    @property
    def object_name(self) -> str:
        """The name of the session's Durable Object (`served_agents.object_name`)."""
        return self.name if self.agent is None else f"{self.agent}:{self.name}"

    async def forward(self, command: Command) -> Reply:
        """Send `command` to the session's Durable Object; its answer is the reply. The
        command names the session and, of a served agent's, the agent."""
        update = {"name": self.name, "agent": self.agent}
        try:
            return await self.dispatch(self.object_name, command.model_copy(update=update))
        except Exception as exc:
            return internal_error(exc, f"session {self.object_name!r}")


Handler = Callable[[Request], Awaitable[Reply]]


def forwarding(command: type[Command]) -> Handler:
    """The handler of a route that takes nothing but its path: it sends the session's
    object a `command` with no fields ("POST .../cancel" -> `Cancel()`)."""

    async def forward(request: Request) -> Reply:
        return await request.forward(command())

    forward.__name__ = f"forward_{command.__name__}"
    return forward


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the table: `method` on `path` (a template: "/sessions/{name}/cancel")
    runs `handler`, for `access` (the API token only, or also a session token for the
    session {name}). `what` names it in a 403 when it has no {name}."""

    method: str
    path: str
    handler: Handler
    access: Access = API_TOKEN
    what: str = ""
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.path))
        object.__setattr__(self, "pattern", re.compile(regex))

    def params(self, path: str) -> dict[str, str] | None:
        """The template's parameters in `path`, or None if it is not this route's path."""
        found = self.pattern.fullmatch(path)
        return None if found is None else found.groupdict()


def route_for(
    routes: Sequence[Route], method: str, path: str, grant: Grant, agent: str | None = None
) -> tuple[Route, dict[str, str]] | Reply:
    """The route that answers `method` on `path` for `grant`, with its parameters; or what
    the table answers instead: 404 (no such path), 405 (with Allow), 400 (a bad session
    name), 403 (a session token out of its scope). `agent`: the served agent whose routes
    `path` is under (`/agents/{agent}` taken off it), None for the default agent's."""
    matching = [(r, p) for r in routes if (p := r.params(path)) is not None]
    if not matching:
        return _not_found(routes, path)
    found = next(((r, p) for r, p in matching if r.method == method), None)
    if found is None:
        listed = ", ".join(r.method for r, _ in matching)
        return error_reply(405, "method-not-allowed", f"{path} accepts {listed} only", Allow=listed)
    route, params = found
    if "name" in params and SESSION_NAME.fullmatch(params["name"]) is None:
        return error_reply(
            400,
            "invalid-session-name",
            "a session name is 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'",
        )
    name = params.get("name")
    scope = name if name is None or agent is None else f"{agent}:{name}"
    refused = _out_of_scope(route, grant, scope, method, path)
    return found if refused is None else refused


def _not_found(routes: Sequence[Route], path: str) -> Reply:
    """404: a path under an endpoint that takes no item ("/sessions/a/cancel/x") is named
    as such; any other unknown path is pointed at /sessions/{name}."""
    parent = path.rpartition("/")[0]
    if any(_endpoint(r) and r.params(parent) is not None for r in routes):
        return error_reply(404, "not-found", f"no endpoint at {path[:200]!r}")
    return error_reply(
        404, "not-found", f"no endpoint at {path[:200]!r}; the API serves /sessions/{{name}}"
    )


def _endpoint(route: Route) -> bool:
    """Whether `route` is an endpoint of a session ("/sessions/{name}/cancel"): a fixed
    last segment after a parameter."""
    head, _, last = route.path.rpartition("/")
    return head.endswith("}") and "{" not in last


def _out_of_scope(
    route: Route, grant: Grant, name: str | None, method: str, path: str
) -> Reply | None:
    """The 403 for a session token used outside its session or its routes, else None."""
    if grant is MASTER:
        return None
    if name is None:
        return forbidden(route.what)
    if grant != name:  # a session's object name: `<agent>:<name>` for a served agent's
        return forbidden(f"session {name!r} (the token grants session {grant!r} only)")
    if route.access != SESSION_TOKEN:
        return forbidden(f"{method} {path} (a session token talks and reads only)")
    return None
