"""Calling the Worker's HTTP side on CPython (`durable_agents.cloudflare.app`): a
dispatch that records the commands that would reach a session's Durable Object, and the
server-sent events of a streamed `Reply`, parsed."""

from __future__ import annotations

import json
from typing import Any

from durable_agents.cloudflare.app import Command, Reply


class Recorder:
    """A dispatch that records what reached the 'Durable Object' and answers 200."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Command]] = []

    async def __call__(self, name: str, command: Command) -> Reply:
        self.commands.append((name, command))
        return Reply(200, {"ok": True})


def parse(chunks: list[bytes]) -> list[tuple[str, str | None, Any]]:
    """(event, id, data) of each server-sent event in `chunks`; comments dropped."""
    events = []
    for block in b"".join(chunks).decode().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            events.append((fields["event"], fields.get("id"), json.loads(fields["data"])))
    return events


async def read_all(reply: Reply) -> list[tuple[str, str | None, Any]]:
    assert reply.stream is not None, reply.body
    return parse([chunk async for chunk in reply.stream])
