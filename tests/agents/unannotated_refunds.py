"""A refund agent written quickly, without type annotations beyond the tool arguments."""

import os

from pydantic import BaseModel

from durable_agents import Agent, ConfigurationError, tool
from durable_agents.llm.settings import setting

SETTINGS = ("PAYMENTS_API_URL",)


class OrderRef(BaseModel):
    order_id: str


class RefundRequest(BaseModel):
    order_id: str
    amount_cents: int


@tool(safe_to_retry=True)
async def lookup_order(args: OrderRef, ctx):
    """Look an order up."""
    response = await ctx.deps["http"].get(f"{ctx.deps['url']}/orders/{args.order_id}")
    response.raise_for_status()
    return response.json()


@tool(requires_approval=True)
async def issue_refund(args: RefundRequest, ctx):
    """Refund an order, once approved."""
    response = await ctx.deps["http"].post(
        f"{ctx.deps['url']}/refunds",
        json=args.model_dump(),
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    return response.json()


AGENT = Agent("refunds", "You refund orders.", [lookup_order, issue_refund])


def make_deps(env, http):
    url = setting(env, "PAYMENTS_API_URL") or os.environ.get("PAYMENTS_API_URL")
    if not url:
        raise ConfigurationError("PAYMENTS_API_URL is not set")
    return {"url": url, "http": http}


def refund_stub(method, path, body, headers):
    if path.startswith("/orders/"):
        return 200, {"id": path.split("/")[-1], "amount_cents": 500}
    return 200, {"id": "re_1", "status": "succeeded"}


DEV_STUBS = {"PAYMENTS_API_URL": refund_stub}
