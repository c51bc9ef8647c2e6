"""A refund agent: look an order up, refund it, at most once.

An agent module (the protocol is in `durable_agents.cloudflare.agent_module`):
copy it to `src/agent.py` and add `PAYMENTS_API_URL` to `[vars]` to serve it,
or try it as it is with `scripts/dev --agent examples/refunds/agent.py`.

- `lookup_order` (`safe_to_retry`): GET `{PAYMENTS_API_URL}/orders/{id}`. A
  pure read: a crash that loses its result just runs it again.
- `issue_refund` (a side effect, `requires_approval`): POST
  `{PAYMENTS_API_URL}/refunds` with `Idempotency-Key: <ctx.idempotency_key>`.
  It runs only once a person approved that exact call (`approve()`, or `POST
  /sessions/{name}/approvals/{tool_call_id}` with the call's digest): the turn
  answers `awaiting_approval` until then, and a denied call gets a
  `tool-denied` result instead of running. The kit never sends it twice: a
  crash that loses its result gives the model a `tool-durability-error`, and
  the model is told to check the order before trying again. The key makes
  the request safe to repeat at the payments API (it is the same for this
  call, always), for a client of yours that retries it.

`make_llm`: offline (`LLM_PROVIDER` unset or `demo`) a `FunctionLLM`,
`play_refunds`, that reads the order id from the message ("refund order
A-1"), looks the order up, asks to refund what is left of it, then reports the
refund, the denial or the lost result; with a provider set, `llm_from_env`.
With `PAYMENTS_API_URL` empty, the dev server points it at `DEV_STUBS`, a
payments API that keeps its orders and refunds in memory and honours the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx
from pydantic import BaseModel, Field

from durable_agents import (
    LLM,
    Agent,
    ConfigurationError,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    tool,
)
from durable_agents.llm import FunctionLLM, llm_from_env
from durable_agents.llm.settings import setting

SETTINGS = ("PAYMENTS_API_URL",)
INSTRUCTIONS = (
    "You handle refund requests. Look the order up with lookup_order, then refund it with "
    "issue_refund (the amount in cents, at most what was paid and not yet refunded), then "
    "say what you did. If issue_refund's result is a tool-durability-error, the refund may "
    "have gone through: look the order up again before any new refund, and never refund "
    "more than was paid."
)


class OrderRef(BaseModel):
    order_id: str = Field(description="The order id, e.g. 'ord_1001'", min_length=1, max_length=64)


class Order(BaseModel):
    id: str
    amount_cents: int
    currency: str
    status: str
    refunded_cents: int = 0


class RefundRequest(BaseModel):
    order_id: str = Field(description="The order to refund", min_length=1, max_length=64)
    amount_cents: int = Field(description="How much to refund, in cents", gt=0)
    reason: str = Field(description="Why, in a few words", min_length=1, max_length=500)


class Refund(BaseModel):
    id: str
    order_id: str
    amount_cents: int
    status: str


@dataclass(frozen=True, slots=True)
class PaymentsDeps:
    """What the handlers get as `ctx.deps` (from `make_deps`)."""

    api_url: str
    http: httpx.AsyncClient


@tool(safe_to_retry=True, timeout=10)
async def lookup_order(args: OrderRef, ctx: ToolContext[PaymentsDeps]) -> Order:
    """Look an order up: what was paid, and how much of it is already refunded."""
    deps = ctx.deps
    response = await deps.http.get(f"{deps.api_url}/orders/{quote(args.order_id, safe='')}")
    response.raise_for_status()
    return Order.model_validate(response.json())


@tool(timeout=30, requires_approval=True)
async def issue_refund(args: RefundRequest, ctx: ToolContext[PaymentsDeps]) -> Refund:
    """Refund (part of) an order, once a person approved it. A side effect: refunds once."""
    deps = ctx.deps
    response = await deps.http.post(
        f"{deps.api_url}/refunds",
        json=args.model_dump(),
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    return Refund.model_validate(response.json())


AGENT = Agent(
    "refunds", INSTRUCTIONS, [lookup_order, issue_refund], max_steps=8, deps_type=PaymentsDeps
)


def make_deps(env: Any, http: httpx.AsyncClient) -> PaymentsDeps:
    """The payments API's URL from the Worker's env; ConfigurationError if it is not set."""
    url = setting(env, "PAYMENTS_API_URL")
    if url is None:
        raise ConfigurationError(
            "PAYMENTS_API_URL is not set: the refund tools need it ([vars] in wrangler.toml, "
            "or .dev.vars)"
        )
    return PaymentsDeps(str(url).rstrip("/"), http)


def make_llm(env: Any) -> LLM:
    """Offline (LLM_PROVIDER unset or demo): the scripted refund model. Else `llm_from_env`."""
    provider = setting(env, "LLM_PROVIDER")
    offline = provider is None and setting(env, "LLM_API_KEY") is None
    if offline or str(provider).strip().lower() == "demo":
        return FunctionLLM(play_refunds)
    return llm_from_env(env)


# --- the offline model -------------------------------------------------------------

# "order A-1", "order #7", or else the first number in the message.
_ORDER_ID = re.compile(r"\border\s+#?([A-Za-z0-9_-]+)|\b(\d+)\b", re.IGNORECASE)


def play_refunds(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """The agent's next move in the current turn, read from the conversation alone.

    Asked to refund an order, it looks the order up, asks to refund what is
    left of it (`issue_refund` waits for a person's approval), then says what
    happened: refunded, denied (nothing was refunded), or the result lost (it
    may have gone through; it does not refund again).
    """
    start = max((i for i, m in enumerate(messages) if m.role == "user"), default=0)
    turn = messages[start:]
    ask = turn[0].content if turn and turn[0].role == "user" else ""
    match = _ORDER_ID.search(ask)
    order_id = next((g for g in match.groups() if g), None) if match else None
    results = {m.tool_name: _parse(m.content) for m in turn if m.role == "tool"}
    call_id = f"demo_{len(messages)}"

    if "issue_refund" in results:
        refund = results["issue_refund"]
        kind = refund.get("kind")
        if kind == "tool-durability-error":
            return LLMResponse(
                f"The refund of order {order_id} may have gone through: the run stopped "
                "before its result was saved. I will not refund again; check the order first."
            )
        if kind == "tool-denied":
            why = f" ({refund['reason']})" if refund.get("reason") else ""
            return LLMResponse(f"The refund of order {order_id} was denied{why}: nothing refunded.")
        if "error" in refund:
            return LLMResponse(f"The refund of order {order_id} failed: {refund['error']}")
        cents = int(refund.get("amount_cents") or 0)
        return LLMResponse(
            f"Refunded {cents / 100:.2f} on order {order_id} (refund {refund.get('id')})."
        )
    if "lookup_order" in results:
        order = results["lookup_order"]
        if "error" in order:
            return LLMResponse(f"I could not look order {order_id} up: {order['error']}")
        left = int(order.get("amount_cents") or 0) - int(order.get("refunded_cents") or 0)
        if left <= 0:
            return LLMResponse(f"Order {order_id} is already refunded in full.")
        arguments = {"order_id": order_id, "amount_cents": left, "reason": "asked by the customer"}
        return LLMResponse(
            f"Asking to refund {left / 100:.2f} on order {order_id}.",
            [ToolCall(call_id, "issue_refund", arguments)],
        )
    if order_id:
        return LLMResponse(
            f"Looking order {order_id} up.",
            [ToolCall(call_id, "lookup_order", {"order_id": order_id})],
        )
    return LLMResponse(
        "I am the offline refund model. Ask me to refund an order, for example "
        "'refund order A-1': I look it up and ask to refund it, once a person approves."
    )


def _parse(content: str) -> dict[str, Any]:
    # Tool results are JSON the kit wrote (bounded in depth), or plain text.
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return {"text": content}
    return data if isinstance(data, dict) else {"value": data}


# --- dev stub: a payments API in memory, for an empty PAYMENTS_API_URL ------------------

_refunds: dict[str, dict[str, Any]] = {}  # by Idempotency-Key (or by id, without one)
_PAID_CENTS = 4999


def payments_stub(
    method: str, path: str, body: bytes, headers: Mapping[str, str]
) -> tuple[int, Any]:
    """`GET /orders/{id}` (every order exists, paid 49.99 USD) and `POST /refunds`
    (a repeated Idempotency-Key returns the first refund, as Stripe does). A query
    string (`?expand=...`) is ignored."""
    path, _, _query = path.partition("?")
    order = re.fullmatch(r"/orders/([^/]+)", path)
    if method == "GET" and order is not None:
        order_id = unquote(order.group(1))
        refunded = sum(r["amount_cents"] for r in _refunds.values() if r["order_id"] == order_id)
        return 200, {
            "id": order_id,
            "amount_cents": _PAID_CENTS,
            "currency": "usd",
            "status": "refunded" if refunded >= _PAID_CENTS else "paid",
            "refunded_cents": refunded,
        }
    if method == "POST" and path == "/refunds":
        try:
            request = RefundRequest.model_validate_json(body)
        except ValueError as exc:
            return 400, {"error": f"not a refund request: {exc}"[:500]}
        key = headers.get("idempotency-key", "")
        if key and key in _refunds:
            print(f"dev: payments stub: a repeated Idempotency-Key {key}: no second refund")
            return 200, _refunds[key]
        refund_id = f"re_{len(_refunds) + 1}"
        refund = {
            "id": refund_id,
            "order_id": request.order_id,
            "amount_cents": request.amount_cents,
            "status": "succeeded",
        }
        _refunds[key or refund_id] = refund
        print(
            f"dev: payments stub refunded {request.amount_cents} cents of order "
            f"{request.order_id}: {json.dumps(request.reason)} (Idempotency-Key {key or 'none'})"
        )
        return 200, refund
    return 404, {"error": f"the dev payments API has no {method} {path}"}


DEV_STUBS = {"PAYMENTS_API_URL": payments_stub}
