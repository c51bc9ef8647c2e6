"""Scoped access: `POST /sessions/{name}/token` mints a short-lived token (HMAC-SHA256 keyed by
SESSION_TOKEN_SECRET) that grants that one session's endpoints; another session is a 403, an
expired or tampered token a 401, and only API_TOKEN mints, lists or deletes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable_agents.cloudflare.app import Command, Reply, handle_request
from durable_agents.cloudflare.tokens import (
    SessionTokenError,
    mint_session_token,
    verify_session_token,
)

TOKEN = "master-token"
SECRET = "0123456789abcdef0123456789abcdef-secret"
ENV = {"API_TOKEN": TOKEN, "SESSION_TOKEN_SECRET": SECRET}
NOW = 1_800_000_000.0


class Recorder:
    def __init__(self) -> None:
        self.commands: list[tuple[str, Command]] = []

    async def __call__(self, name: str, command: Command) -> Reply:
        self.commands.append((name, command))
        return Reply(200, {"ok": True})


async def call(
    method: str, path: str, bearer: str, body: Any = None, *, now: float = NOW,
    env: dict[str, str] | None = None, recorder: Recorder | None = None,
) -> Reply:  # fmt: skip
    raw = b"" if body is None else json.dumps(body).encode()
    return await handle_request(
        method, path, {"authorization": f"Bearer {bearer}"}, raw, env=ENV if env is None else env,
        dispatch=recorder or Recorder(), clock=lambda: now,
    )  # fmt: skip


async def mint(name: str = "support-42", **body: Any) -> dict[str, Any]:
    reply = await call("POST", f"/sessions/{name}/token", TOKEN, body or None)
    assert reply.status == 200, reply.body
    answer: dict[str, Any] = reply.body
    return answer


async def test_a_minted_token_expires_after_its_ttl_and_names_its_session() -> None:
    answer = await mint(ttl_seconds=600)
    assert set(answer) == {"token", "expires_at", "session"}
    assert answer["expires_at"] == int(NOW) + 600
    assert answer["session"] == "support-42"
    assert verify_session_token(SECRET, answer["token"], now=NOW) == "support-42"
    assert (await mint())["expires_at"] == int(NOW) + 3600  # the default


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/sessions/support-42", None),
        ("POST", "/sessions/support-42/messages", {"message": "hi"}),
        ("POST", "/sessions/support-42/resume", None),
        ("GET", "/sessions/support-42/events", None),
        ("POST", "/sessions/support-42/cancel", None),
        ("GET", "/sessions/support-42/approvals", None),
        ("GET", "/sessions/support-42/view", None),
    ],
)
async def test_a_session_token_grants_its_own_sessions_endpoints(
    method: str, path: str, body: Any
) -> None:
    token = (await mint())["token"]
    recorder = Recorder()
    reply = await call(method, path, token, body, recorder=recorder)
    assert reply.status == 200, reply.body
    assert [name for name, _ in recorder.commands] == ["support-42"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/sessions/support-43"),
        ("POST", "/sessions/support-43/messages"),
        ("GET", "/sessions/support-4"),
        ("GET", "/sessions"),  # listing every session
        ("POST", "/sessions/support-42/token"),  # minting more
        ("DELETE", "/sessions/support-42"),  # deleting
    ],
)
async def test_anything_else_is_forbidden_and_reaches_no_session(method: str, path: str) -> None:
    token = (await mint())["token"]
    recorder = Recorder()
    reply = await call(method, path, token, {"message": "hi"}, recorder=recorder)
    assert reply.status == 403, reply.body
    assert reply.body["error"]["code"] == "forbidden"
    assert recorder.commands == []


async def test_an_expired_or_tampered_token_is_a_401() -> None:
    token = (await mint(ttl_seconds=60))["token"]
    assert (await call("GET", "/sessions/support-42", token, now=NOW + 59)).status == 200
    expired = await call("GET", "/sessions/support-42", token, now=NOW + 60)
    assert expired.status == 401
    assert "expired" in expired.body["error"]["message"]

    prefix, name, expires, signature = token.split(".")
    forged = [
        f"{prefix}.support-43.{expires}.{signature}",  # another session, same signature
        f"{prefix}.{name}.{int(expires) + 9999}.{signature}",  # a later expiry
        f"{prefix}.{name}.{expires}.{signature[:-1]}{'A' if signature[-1] != 'A' else 'B'}",
        f"{prefix}.{name}.{expires}",
        f"{prefix}.{name}.0{expires}.{signature}",  # the same expiry, another text
        f"{prefix}.{name}.00{expires}.{signature}",
        f"{prefix}.{name}.+{expires}.{signature}",
        token + ".",
        token.replace("dast1", "dast2"),
        mint_session_token("another-secret-of-thirty-two-bytes!!", name, expires_at=int(expires)),
    ]
    for bad in forged:
        reply = await call("GET", f"/sessions/{name}", bad)
        assert reply.status == 401, bad
        assert bad not in json.dumps(reply.body)  # never echoed


async def test_tokens_need_the_secret_and_only_the_master_token_mints() -> None:
    no_secret = {"API_TOKEN": TOKEN}
    reply = await call("POST", "/sessions/a/token", TOKEN, env=no_secret)
    assert (reply.status, reply.body["error"]["code"]) == (500, "configuration")
    token = mint_session_token(SECRET, "a", expires_at=int(NOW) + 60)
    assert (await call("GET", "/sessions/a", token, env=no_secret)).status == 401
    short = {"API_TOKEN": TOKEN, "SESSION_TOKEN_SECRET": "short"}
    assert (await call("GET", "/sessions/a", TOKEN, env=short)).status == 500


@pytest.mark.parametrize(
    "body", [{"ttl_seconds": 0}, {"ttl_seconds": -5}, {"ttl_seconds": 10**9},
             {"ttl_seconds": "60"}, {"ttl_seconds": True}, {"ttl": 60}],
)  # fmt: skip
async def test_a_bad_ttl_is_a_422(body: dict[str, Any]) -> None:
    reply = await call("POST", "/sessions/a/token", TOKEN, body)
    assert (reply.status, reply.body["error"]["code"]) == (422, "invalid-body")


def test_verify_refuses_malformed_tokens_without_raising_anything_else() -> None:
    for text in ["", "dast1", "dast1....", "dast1.a.1.x", "dast1.a b.1." + "A" * 43,
                 "dast1.a.99999999999999." + "A" * 43, "dast1.\u00e9.1." + "A" * 43]:  # fmt: skip
        with pytest.raises(SessionTokenError):
            verify_session_token(SECRET, text, now=NOW)
