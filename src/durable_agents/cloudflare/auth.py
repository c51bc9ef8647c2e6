"""Who is calling: the API token (`MASTER`, everything) or a session token (one session,
the routes marked for it). Tokens themselves are made and checked in `tokens.py`; the
guide is docs/operating.md#scoped-access.
"""

from __future__ import annotations

import hmac

from .config import ApiSettings
from .tokens import SessionTokenError, looks_like_session_token, verify_session_token
from .wire import Reply, error_reply

__all__ = ["MASTER", "Grant", "authorize", "check_bearer", "forbidden"]

MASTER = object()  # what API_TOKEN grants: everything
Grant = object  # MASTER, or the session name a session token grants (a str)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="durable-agents"'}


def authorize(authorization: str | None, settings: ApiSettings, now: float) -> Grant | Reply:
    """`MASTER` for `Bearer <API_TOKEN>`, the session name a valid session token grants,
    or a 401. Both are compared in constant time; no token is ever logged."""
    assert settings.api_token is not None  # checked before
    denied = check_bearer(authorization, settings.api_token)
    if denied is None:
        return MASTER
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not looks_like_session_token(token) or not token.isascii():
        return denied
    if settings.session_token_secret is None:
        return error_reply(
            401, "unauthorized", "session tokens are off (SESSION_TOKEN_SECRET is not set)",
            **_CHALLENGE,
        )  # fmt: skip
    try:
        return verify_session_token(settings.session_token_secret, token, now=now)
    except SessionTokenError as exc:
        return error_reply(401, "unauthorized", str(exc), **_CHALLENGE)


def check_bearer(authorization: str | None, api_token: str) -> Reply | None:
    """None if `authorization` is `Bearer <api_token>`, else a 401."""
    if not authorization:
        return error_reply(
            401, "unauthorized", "missing 'Authorization: Bearer <API_TOKEN>'", **_CHALLENGE
        )
    # Exactly `Bearer <token>` (RFC 6750): the scheme in any case, one ASCII space, the
    # token as sent. Nothing is stripped, so `Bearer <token>\xa0` or `Bearer  <token>` is
    # not the token; a non-ASCII value is simply not it. Compared as bytes in constant
    # time, so the reply time says nothing about the token.
    scheme, _, token = authorization.partition(" ")
    if (
        not authorization.isascii()
        or scheme.lower() != "bearer"
        or not hmac.compare_digest(token.encode(), api_token.encode())
    ):
        return error_reply(401, "unauthorized", "the bearer token is not valid", **_CHALLENGE)
    return None


def forbidden(what: str) -> Reply:
    """403: what a session token does not grant."""
    return error_reply(403, "forbidden", f"a session token does not grant {what}")
