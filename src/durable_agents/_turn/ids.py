"""The ids a run makes: session ids, tool call ids unique in their session, and the
idempotency key a handler gets for its call (docs/contract.md, docs/python-api.md)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import ConfigurationError
from ..messages import CALL_ID, Message, ToolCall

__all__ = ["CallIds", "idempotency_key", "random_id"]


def random_id() -> str:
    """A random id (a UUID's hex), drawn at call time."""
    return uuid.uuid4().hex


def idempotency_key(session_id: str, tool_call_id: str) -> str:
    """The key handed to a tool call's handler: stable per call, distinct across calls."""
    digest = hashlib.sha256(f"{session_id}\x00{tool_call_id}".encode()).hexdigest()
    return f"da-{digest[:40]}"


class CallIds:
    """The tool call ids of one session as a run knows them, and the ids it gives new calls.

    Every id a call of the session has (or had, from its provider) is taken: a
    repeat is a duplicate. Provider ids the kit replaced never match CALL_ID, so
    never a kit id."""

    def __init__(self, history: Sequence[Message], new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.taken = {i for m in history for c in m.tool_calls for i in (c.id, c.provider_id) if i}

    def assign(self, calls: Sequence[ToolCall], base: int) -> list[ToolCall]:
        """Give every call an id unique in the session, so it can be matched to one result,
        and one a URL carries as it is (`CALL_ID`). A provider's id that is neither keeps
        going back to the provider (`provider_id`); a duplicate does not (the provider
        would get two calls of one id). `base`: where the loaded history begins."""
        assigned = []
        for call in calls:
            if not call.id or call.id in self.taken:
                call = replace(call, id=self.fresh(), provider_id=None)
            elif CALL_ID.fullmatch(call.id) is None or base > 0:
                # Past a summary the ids before it are not loaded: a provider's could
                # repeat one of them unseen, so it is kept beside an id of the kit's.
                call = replace(call, id=self.fresh(), provider_id=call.id)
                self.taken.add(call.id if call.provider_id is None else call.provider_id)
            self.taken.add(call.id)
            assigned.append(call)
        return assigned

    def fresh(self) -> str:
        """A new call id from `new_id`; ConfigurationError if it is not one."""
        call_id = f"call_{self.new_id()}"
        if CALL_ID.fullmatch(call_id) is None or call_id in self.taken:
            raise ConfigurationError(
                f"new_id() made {call_id[5:][:80]!r}, which is not a new tool call id: an id is "
                "1 to 250 of A-Z a-z 0-9 _ . : ~ - and unique in its session"
            )
        return call_id
