"""Session tokens: short-lived bearer tokens that grant one session's endpoints, nothing else.

    token = mint_session_token(secret, "support-42", expires_at=now + 3600)
    name = verify_session_token(secret, token, now=now)   # "support-42", or SessionTokenError
    token = mint_session_token(secret, "support-42", expires_at=..., agent="refunds")
    verify_session_token(secret, token, now=now)          # "refunds:support-42"

A token is `dast1.<scope>.<expires_at>.<signature>`: the scope is the session name (1-64
of A-Z a-z 0-9 _ -, so it needs no encoding) for a session of the default agent, or
`<agent>:<name>` for one of the served agent `agent` (`/agents/{agent}/sessions/{name}`):
the name of the session's Durable Object (`served_agents.object_name`), so a token of one
agent's session never opens another agent's session of the same name. Then the expiry in
Unix seconds, and HMAC-SHA256 over both, keyed by the secret setting `SESSION_TOKEN_SECRET`
(url-safe base64, no padding). Nothing is stored: the signature is the
proof, checked in constant time. A browser holds such a token instead of
the master `API_TOKEN` (see docs/operating.md, "Scoped access").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

__all__ = ["SessionTokenError", "mint_session_token", "verify_session_token"]

PREFIX = "dast1"
# Canonical fields only: one text per token. The expiry is digits without a leading
# zero or a sign (`int()` would also take "0123", "+123" and "1_000"), and the
# signature is compared as text, so no two texts carry one signed value.
_SHAPE = re.compile(
    r"dast1\.((?:[a-z][a-z0-9_]{0,31}:)?[A-Za-z0-9_-]{1,64})\.([1-9][0-9]{0,11})\.([A-Za-z0-9_-]{43})"
)
MIN_SECRET_BYTES = 32


class SessionTokenError(ValueError):
    """A token that is not valid: malformed, tampered with, or (`expired`) too old."""

    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


def check_secret(secret: str) -> None:
    """ValueError unless `secret` is long enough to key HMAC-SHA256 well."""
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(
            f"SESSION_TOKEN_SECRET must be at least {MIN_SECRET_BYTES} bytes (e.g. "
            "`openssl rand -hex 32`)"
        )


def mint_session_token(secret: str, name: str, *, expires_at: int, agent: str | None = None) -> str:
    """A token for session `name` (of the served agent `agent`; None: the default agent's),
    valid until `expires_at` (Unix seconds)."""
    check_secret(secret)
    scope = name if agent is None else f"{agent}:{name}"
    token = f"{PREFIX}.{scope}.{expires_at}.{_sign(secret, scope, expires_at)}"
    if _SHAPE.fullmatch(token) is None:
        raise ValueError(f"cannot make a token for session {scope[:120]!r}")
    return token


def looks_like_session_token(token: str) -> bool:
    return token.startswith(PREFIX + ".")


def verify_session_token(secret: str, token: str, *, now: float) -> str:
    """The session `token` grants, as its scope: the session name (the default agent's) or
    `<agent>:<name>`; SessionTokenError if it is not valid at `now`."""
    match = _SHAPE.fullmatch(token)
    if match is None:
        raise SessionTokenError("the session token is malformed")
    name, expires_text, signature = match.groups()
    expires_at = int(expires_text)
    expected = _sign(secret, name, expires_at)
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        raise SessionTokenError("the session token's signature does not match")
    if now >= expires_at:
        raise SessionTokenError("the session token has expired", expired=True)
    return name


def _sign(secret: str, name: str, expires_at: int) -> str:
    message = f"{PREFIX}\n{name}\n{expires_at}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
