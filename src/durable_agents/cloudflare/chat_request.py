"""What an AI SDK chat request asks, read once for both transports: `POST .../chat`
(`chat_http.py`, `DefaultChatTransport`) and a WebSocket `send` frame (`chat_socket.py`,
`WebSocketChatTransport`) carry the same `{id, messages, trigger, messageId}`.

Only the newest message is new (the stored history stays the truth): a user message is a
turn keyed by the message's id, an assistant message with the client's tool approval
responses (`addToolApprovalResponse`) is one digest-bound decision per call, and anything
else (`regenerate-message`: the history is append-only) is refused before the session's
object is asked. The guide: docs/chat-clients.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr
from pydantic_core import ErrorDetails

from .bodies import Body
from .commands import REQUEST_KEY, Approve, Decision, SendMessage
from .ui_stream import parse_approval_id, reply_message_id
from .wire import Reply, error_reply

__all__ = ["ChatAsk", "ChatBody", "ChatMessage", "read_chat"]


class ChatMessage(BaseModel):
    """One UI message as the AI SDK sends it: its id, role and parts (other fields ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    role: Literal["user", "assistant", "system"]
    parts: list[dict[str, Any]]

    @property
    def text(self) -> str:
        """The text of its text parts, one after another."""
        texts = (p.get("text") for p in self.parts if p.get("type") == "text")
        return "\n".join(t for t in texts if isinstance(t, str))

    def decisions(self) -> list[Decision]:
        """The tool approval responses in its parts (`addToolApprovalResponse`), as decisions."""
        found = []
        for part in self.parts:
            approval = part.get("approval")
            if part.get("state") != "approval-responded" or not isinstance(approval, dict):
                continue
            named = parse_approval_id(str(approval.get("id", "")))
            if named is None or not isinstance(approval.get("approved"), bool):
                continue
            reason = approval.get("reason")
            found.append(
                Decision(
                    tool_call_id=named[0],
                    digest=named[1],
                    approved=approval["approved"],
                    reason=reason if isinstance(reason, str) else None,
                )
            )
        return found


class ChatBody(Body):
    """What `DefaultChatTransport` posts and a `send` frame carries, `{id, messages,
    trigger, messageId}` (and whatever `body` the app adds: ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    SHAPE: ClassVar[str] = (
        "the body is what the AI SDK's DefaultChatTransport sends: {'id', 'messages': "
        "[{'id', 'role', 'parts': [...]}, ...], 'trigger': 'submit-message'}"
    )

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    trigger: Literal["submit-message", "regenerate-message"]

    @classmethod
    def explain(cls, errors: list[ErrorDetails], data: Mapping[str, Any]) -> str:
        where = ".".join(str(p) for p in errors[0]["loc"])
        return f"{where}: {errors[0]['msg']}; {cls.SHAPE}"


@dataclass(frozen=True, slots=True)
class ChatAsk:
    """What a chat request asks of the session's object: `commands`, sent in order, the
    last one streaming the turn (a user message's `SendMessage`; or an `Approve` per
    approval response, the last going on with the turn), and `message_id`, the UI message
    the turn's chunks build (a new reply's, or the assistant message the client answered)."""

    commands: tuple[SendMessage | Approve, ...]
    message_id: str

    async def send(self, send: Callable[[SendMessage | Approve], Awaitable[Reply]]) -> Reply:
        """The commands through `send`, in order: the answer to the last (its turn), or the
        first refusal, which stops the rest (the decisions before the last stream nothing)."""
        *before, last = self.commands
        for command in before:
            decided = await send(command)
            if decided.status >= 400:
                return decided
        return await send(last)


def read_chat(body: ChatBody) -> ChatAsk | Reply:
    """What `body`'s newest message asks, or the 4xx refusing it (nothing is asked of the
    session: `regenerate-message`, a user message with no text or an id that cannot key a
    turn, an assistant message without approval responses)."""
    if body.trigger == "regenerate-message":
        return error_reply(
            422, "regenerate-not-supported",
            "a session's history is append-only, so a reply cannot be regenerated; send a "
            "new message (trigger 'submit-message') instead",
        )  # fmt: skip
    newest = body.messages[-1]
    if newest.role == "user":
        return _user_message(newest)
    decisions = newest.decisions()
    if newest.role != "assistant" or not decisions:
        return error_reply(
            422, "invalid-body",
            "the newest message must be a user message, or the assistant message with the "
            "client's tool approval responses",
        )  # fmt: skip
    approves = [Approve(decision=d) for d in decisions[:-1]]
    last = Approve(decision=decisions[-1], stream=True)
    return ChatAsk((*approves, last), newest.id)


def _user_message(message: ChatMessage) -> ChatAsk | Reply:
    """A user message's turn, keyed by the message's id (a resend runs no second turn)."""
    text = message.text
    if not text.strip():
        return error_reply(422, "invalid-body", "the newest user message has no text part")
    if REQUEST_KEY.fullmatch(message.id) is None:
        return error_reply(
            422, "invalid-body",
            "a user message's id is its turn's Idempotency-Key: 1 to 255 printable ASCII",
        )  # fmt: skip
    command = SendMessage(message=text, request_key=message.id, stream=True)
    return ChatAsk((command,), reply_message_id(message.id))
