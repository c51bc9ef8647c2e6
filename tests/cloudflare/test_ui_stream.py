"""The UI message stream encoder (durable_agents.cloudflare.ui_stream) on CPython: run events
and stored messages to the AI SDK's chunks, exactly; the approval id's round trip.

The AI SDK's own client reads these chunks in test_dev_server_chat_http.py.
"""

from __future__ import annotations

import json

from durable_agents import Message, PendingApproval, RunResult, TextDelta, ToolCall, Usage
from durable_agents.cloudflare.ui_stream import (
    TEXT_PIECE_MAX,
    UIMessageStream,
    approval_id,
    parse_approval_id,
    replay,
    reply_message_id,
    text_pieces,
)
from durable_agents.events import ChildEvent, MessageStored, RunFinished
from durable_agents.messages import ToolErrorKind, tool_error_content

DIGEST = "ab" * 32
LOOKUP = ToolCall("call_1", "lookup", {"order": "A-1"})
REFUND = ToolCall("call_2", "refund", {"order": "A-1", "cents": 4999})


def feed(stream: UIMessageStream, *events: object) -> list[dict[str, object]]:
    chunks: list[dict[str, object]] = []
    for event in events:
        chunks += stream.event(event)  # type: ignore[arg-type]
    return chunks


def result(status: str, pending: list[PendingApproval] | None = None) -> RunResult[None]:
    return RunResult(status, "", "s", [], 1, Usage(), pending=pending or [])  # type: ignore[arg-type]


def test_a_streamed_reply_is_one_text_part_in_one_step() -> None:
    stream = UIMessageStream(reply_message_id("u-1"))
    chunks = feed(
        stream,
        TextDelta("The refund for"),  # a turn's first deltas come before its first write
        TextDelta(" order A-1 is on"),
        TextDelta(" its way."),
        MessageStored(4, Message("user", "hi", request_key="u-1")),
        MessageStored(5, Message.assistant("The refund for order A-1 is on its way.")),
        RunFinished(result("complete")),
    )
    assert chunks == [
        {"type": "start", "messageId": "reply-u-1"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "The refund for "},
        {"type": "text-delta", "id": "text-0", "delta": "order A-1 is "},
        {"type": "text-delta", "id": "text-0", "delta": "on its way."},
        {"type": "text-end", "id": "text-0"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


REPLY = (
    "Your refund for order A-1 (49.99 EUR) is on its way; the receipt is at "
    "https://example.com/receipts/" + "a1b2c3d4" * 20 + " and\n\nthe   money arrives in 3 days."
)


def streamed(deltas: list[str], stored: str) -> list[dict[str, object]]:
    """The chunks after `start` of a reply streamed as `deltas`, then stored as `stored`."""
    stream = UIMessageStream("m")
    events = [TextDelta(d) for d in deltas]
    return feed(stream, *events, MessageStored(1, Message.assistant(stored)))[1:]


def test_text_pieces_are_cut_by_the_text_alone_so_live_and_replay_agree() -> None:
    pieces = text_pieces(REPLY)
    assert "".join(pieces) == REPLY
    assert all(len(piece) <= TEXT_PIECE_MAX for piece in pieces)
    assert max(len(piece) for piece in pieces) == TEXT_PIECE_MAX  # the long URL is cut
    replayed = replay([Message.user("refund A-1"), Message.assistant(REPLY)])[1][1:]
    # However the model's deltas fall (every cut in two, every 9th cut in three), the
    # chunks are the replay's, one for one: a resume by sequence lands on the same chunk.
    cuts = range(1, len(REPLY))
    for first in cuts:
        assert streamed([REPLY[:first], REPLY[first:]], REPLY) == replayed
    for first in cuts[::9]:
        for second in range(first + 1, len(REPLY), 9):
            parts = [REPLY[:first], REPLY[first:second], REPLY[second:]]
            assert streamed(parts, REPLY) == replayed
    assert streamed([REPLY], REPLY) == streamed([*REPLY], REPLY) == replayed


def test_a_stored_reply_that_does_not_go_on_from_its_preview_adds_nothing() -> None:
    # A retried LLM call whose text diverged: the preview stays, the stored text is the truth.
    chunks = streamed(["Hello there, how", " are you"], "Goodbye.")
    assert [c.get("delta") for c in chunks if c["type"] == "text-delta"] == ["Hello there, "]
    assert chunks[-1] == {"type": "text-end", "id": "text-0"}


def test_tool_calls_and_their_results_are_tool_parts() -> None:
    denied = Message.tool_result(
        ToolCall("call_3", "wipe", {}),
        tool_error_content(ToolErrorKind.TOOL_DENIED, "denied", reason="no"),
    )
    failed = Message.tool_result(
        ToolCall("call_4", "boom", {}), tool_error_content(ToolErrorKind.TOOL_FAILED, "it broke")
    )
    calls = [LOOKUP, REFUND, ToolCall("call_3", "wipe", {}), ToolCall("call_4", "boom", {})]
    stream = UIMessageStream()
    chunks = feed(
        stream,
        MessageStored(0, Message.user("refund A-1")),
        MessageStored(1, Message.assistant("Looking.", calls)),
        MessageStored(2, Message.tool_result(LOOKUP, json.dumps({"total": 4999}))),
        MessageStored(3, Message.tool_result(REFUND, "refunded")),
        MessageStored(4, denied),
        MessageStored(5, failed),
        ChildEvent("child", "c", "call_9", TextDelta("not ours")),
        MessageStored(6, Message.assistant("Done.")),
    ) + stream.end("complete")
    names = [{"toolCallId": c.id, "toolName": c.name} for c in calls]
    assert chunks[:6] == [
        {"type": "start"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Looking."},
        {"type": "text-end", "id": "text-0"},
        {"type": "tool-input-start", **names[0]},
    ]
    assert chunks[6:13] == [
        {"type": "tool-input-available", **names[0], "input": {"order": "A-1"}},
        {"type": "tool-input-start", **names[1]},
        {"type": "tool-input-available", **names[1], "input": {"order": "A-1", "cents": 4999}},
        {"type": "tool-input-start", **names[2]},
        {"type": "tool-input-available", **names[2], "input": {}},
        {"type": "tool-input-start", **names[3]},
        {"type": "tool-input-available", **names[3], "input": {}},
    ]
    assert chunks[13:] == [
        {"type": "tool-output-available", "toolCallId": "call_1", "output": {"total": 4999}},
        {"type": "tool-output-available", "toolCallId": "call_2", "output": "refunded"},
        {"type": "tool-output-denied", "toolCallId": "call_3"},
        {"type": "tool-output-error", "toolCallId": "call_4", "errorText": "it broke"},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "Done."},
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_a_turn_waiting_for_approval_ends_with_its_requests() -> None:
    stream = UIMessageStream()
    feed(
        stream,
        MessageStored(0, Message.user("refund A-1")),
        MessageStored(1, Message.assistant("", [REFUND])),
    )
    child_call = PendingApproval("call_7", "charge", {"cents": 5}, DIGEST, session="child-1")
    pending = [PendingApproval("call_2", "refund", REFUND.arguments, DIGEST), child_call]
    assert stream.event(RunFinished(result("awaiting_approval", pending))) == [
        {"type": "tool-approval-request", "approvalId": f"call_2:{DIGEST}", "toolCallId": "call_2"},
        # a child's call has no part in this message yet: its part comes first
        {"type": "tool-input-start", "toolCallId": "call_7", "toolName": "charge"},
        {
            "type": "tool-input-available",
            "toolCallId": "call_7",
            "toolName": "charge",
            "input": {"cents": 5},
        },
        {"type": "tool-approval-request", "approvalId": f"call_7:{DIGEST}", "toolCallId": "call_7"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]


def test_a_continued_turn_keeps_the_clients_message_id() -> None:
    """After an approval the turn goes on in the client's message: the approved call's result
    is for a part the client holds; the next reply is a new step."""
    stream = UIMessageStream("m-1")
    chunks = feed(
        stream,
        MessageStored(2, Message.tool_result(REFUND, '"ok"')),
        MessageStored(3, Message.assistant("Refunded.")),
    ) + stream.end("error", error="the LLM call failed")
    assert chunks == [
        {"type": "start", "messageId": "m-1"},
        {"type": "tool-output-available", "toolCallId": "call_2", "output": "ok"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Refunded."},
        {"type": "text-end", "id": "text-0"},
        {"type": "error", "errorText": "the LLM call failed"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "error"},
    ]


def test_an_error_without_a_result_still_finishes_the_message() -> None:
    stream = UIMessageStream()
    assert stream.event(TextDelta("Hello, I am looking")) == [
        {"type": "start"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Hello, I am "},
    ]
    assert stream.error("store down") == [  # the text held for a whole piece goes first
        {"type": "text-delta", "id": "text-0", "delta": "looking"},
        {"type": "text-end", "id": "text-0"},
        {"type": "error", "errorText": "store down"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "error"},
    ]


def test_a_replay_sends_what_the_live_stream_sent() -> None:
    history = [
        Message.user("earlier"),
        Message.assistant("old reply"),
        Message.user("refund A-1"),
        Message.assistant("", [LOOKUP]),
        Message.tool_result(LOOKUP, "{}"),
        Message.assistant("Done."),
    ]
    live = UIMessageStream(reply_message_id(None, 12))
    sent = feed(live, *(MessageStored(10 + i, m) for i, m in enumerate(history[2:], start=2)))
    stream, chunks = replay(history, first_position=10)
    assert chunks == sent
    assert chunks[0] == {"type": "start", "messageId": "reply@12"}
    keyed = [Message("user", "hi", request_key="u-7"), Message.assistant("Hello")]
    assert replay(keyed)[1][0] == {"type": "start", "messageId": "reply-u-7"}
    assert stream.end("complete") == live.end("complete")
    assert replay([], 0)[1] == [{"type": "start"}]


def test_the_approval_id_carries_the_call_and_its_digest() -> None:
    assert parse_approval_id(approval_id("call_1", DIGEST)) == ("call_1", DIGEST)
    assert parse_approval_id(approval_id("mcp:a:b", DIGEST)) == ("mcp:a:b", DIGEST)
    for bad in ("call_1", f"call_1:{DIGEST[:-1]}", f":{DIGEST}", f"a/b:{DIGEST}", "x:" + "AB" * 32):
        assert parse_approval_id(bad) is None
