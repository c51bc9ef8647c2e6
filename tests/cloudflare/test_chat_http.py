"""POST /sessions/{name}/chat on CPython (durable_agents.cloudflare.chat_http): what reaches the
session's object for a user message and for tool approval responses, the object's turn
events as the UI message stream, and the requests refused before anything is sent.

The AI SDK's own client against the real runtime: test_dev_server_chat_http.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from durable_agents import Message, ToolCall
from durable_agents.cloudflare.app import Command, Reply, handle_request
from durable_agents.cloudflare.commands import Approve, SendMessage
from durable_agents.cloudflare.live import end_event, message_event, sse
from durable_agents.cloudflare.ui_stream import approval_id

TOKEN = "chat-token"
ENV = {"API_TOKEN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}
DIGEST = "cd" * 32
REFUND = ToolCall("call_2", "refund", {"order": "A-1"})


class Session:
    """A dispatch standing for the session's object: records each command, answers with
    the next of `answers` (a Reply, or SSE bytes to stream)."""

    def __init__(self, *answers: Reply | list[bytes]) -> None:
        self.answers = list(answers)
        self.commands: list[Command] = []

    async def __call__(self, name: str, command: Command) -> Reply:
        self.commands.append(command)
        answer = self.answers.pop(0)
        if isinstance(answer, Reply):
            return answer
        return Reply(200, None, stream=_chunks(answer))


async def _chunks(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


async def chat(body: Any, session: Session, path: str = "/sessions/s1/chat") -> Reply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await handle_request("POST", path, AUTH, raw, env=ENV, dispatch=session)


async def ui_chunks(reply: Reply) -> list[Any]:
    assert reply.stream is not None, reply.body
    blocks = b"".join([c async for c in reply.stream]).decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    return [json.loads(b.removeprefix("data: ")) for b in blocks[:-2]]


def user(text: str, message_id: str = "u-1") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def responded(call_id: str, approved: bool, **more: Any) -> dict[str, Any]:
    approval = {"id": approval_id(call_id, DIGEST), "approved": approved, **more}
    return {"type": "tool-refund", "toolCallId": call_id, "state": "approval-responded",
            "input": {}, "approval": approval}  # fmt: skip


def body(*messages: dict[str, Any], trigger: str = "submit-message") -> dict[str, Any]:
    return {"id": "chat-1", "messages": list(messages), "trigger": trigger, "messageId": None,
            "custom": {"from": "the app's body"}}  # fmt: skip


async def test_a_user_message_runs_a_turn_keyed_by_its_id() -> None:
    session = Session(
        [
            sse("delta", {"text": "Hi"}),
            message_event(0, Message("user", "hello", request_key="u-1").to_dict()),
            message_event(1, Message.assistant("Hi").to_dict()),
            end_event(200, {"status": "complete", "response": "Hi"}),
        ]
    )
    history = [user("ignored: the store is the truth", "u-0"), {"id": "a-0", "role": "assistant",
               "parts": []}, user("hello\u00e9")]  # fmt: skip
    reply = await chat(body(*history), session)
    assert (reply.status, reply.headers["x-vercel-ai-ui-message-stream"]) == (200, "v1")
    assert await ui_chunks(reply) == [
        {"type": "start", "messageId": "reply-u-1"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Hi"},
        {"type": "text-end", "id": "text-0"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]
    (command,) = session.commands
    assert isinstance(command, SendMessage)
    assert (command.message, command.request_key, command.stream) == ("hello\u00e9", "u-1", True)


async def test_approval_responses_decide_each_call_and_stream_the_turn() -> None:
    waiting = Reply(200, {"status": "awaiting_approval", "pending": [{"tool_call_id": "call_3"}]})
    session = Session(
        waiting,
        [
            message_event(2, Message.tool_result(REFUND, '{"ok": true}').to_dict()),
            end_event(200, {"status": "complete"}),
        ],
    )
    parts = [
        {"type": "step-start"},
        responded("call_3", False, reason="too much"),
        {"type": "tool-other", "state": "output-available", "toolCallId": "call_1"},
        responded("call_x", True) | {"approval": {"id": "not-ours", "approved": True}},
        responded("call_2", True),
    ]
    reply = await chat(body(user("refund"), {"id": "reply-u-1", "role": "assistant",
                                             "parts": parts}), session)  # fmt: skip
    assert await ui_chunks(reply) == [
        {"type": "start", "messageId": "reply-u-1"},  # the client's message goes on
        {"type": "tool-output-available", "toolCallId": "call_2", "output": {"ok": True}},
        {"type": "finish", "finishReason": "stop"},
    ]
    first, last = session.commands
    assert isinstance(first, Approve)
    assert isinstance(last, Approve)
    assert first.decision.model_dump(exclude_none=True) == {
        "tool_call_id": "call_3", "digest": DIGEST, "approved": False, "reason": "too much",
    }  # fmt: skip
    assert (first.stream, last.decision.tool_call_id, last.stream) == (False, "call_2", True)


async def test_a_refused_decision_is_the_answer() -> None:
    refused = Reply(409, {"error": {"code": "approval-digest-mismatch", "message": "..."}})
    session = Session(refused)
    message = {"id": "a-1", "role": "assistant", "parts": [responded("call_2", True)]}
    reply = await chat(body(user("refund"), message), session)
    assert reply is refused


async def test_a_turn_that_fails_is_an_error_chunk_or_an_http_error() -> None:
    llm_failed = end_event(502, {"status": "error", "error": {"message": "the LLM is down"}})
    session = Session([llm_failed], [], Reply(409, {"error": {"code": "approval-pending"}}))
    assert await ui_chunks(await chat(body(user("a")), session)) == [
        {"type": "start", "messageId": "reply-u-1"},
        {"type": "error", "errorText": "the LLM is down"},
        {"type": "finish", "finishReason": "error"},
    ]
    cut_short = await ui_chunks(await chat(body(user("b", "u-2")), session))
    assert cut_short[1]["type"] == "error"
    assert (await chat(body(user("c", "u-3")), session)).status == 409


async def test_requests_refused_before_the_session_sees_them() -> None:
    session = Session()
    assistant = {"id": "a-1", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}
    for sent, code, words in (
        (body(user("hi"), trigger="regenerate-message"), "regenerate-not-supported",
         "append-only"),
        (body(user("   ")), "invalid-body", "no text"),
        (body(user("hi", "not printable \u00e9")), "invalid-body", "Idempotency-Key"),
        (body(user("hi"), assistant), "invalid-body", "approval responses"),
        (body(), "invalid-body", "messages"),
        (body(user("hi"), trigger="resume-stream"), "invalid-body", "trigger"),
        ({"messages": [{"role": "user", "parts": []}], "trigger": "submit-message"},
         "invalid-body", "messages.0.id"),
    ):  # fmt: skip
        reply = await chat(sent, session)
        assert (reply.status, reply.body["error"]["code"]) == (422, code), reply.body
        assert words in reply.body["error"]["message"]
    assert (await chat(b"[1]", session)).status == 422
    assert session.commands == []
