"""What one Workers invocation may still do: its subrequests and D1 queries.

Cloudflare counts, per invocation (a request to the Worker, to a Durable Object,
an alarm), the subrequests it makes (`fetch`: the LLM's and the tools') and the
D1 queries it runs (each statement of a batch is one), and refuses the ones past
the plan's limits (`WORKERS_PLAN`: free 50 and 50, paid 10,000 and 1,000). The
session's Durable Object sets an `InvocationBudget` for each invocation
(`invocation(...)`); the fetch transport and the D1 store `spend()` from it; the
run loop asks `calls_that_fit()` before it runs a step's handlers, and defers the
calls that do not fit to a fresh invocation (see `run()`, status "deferred").

Outside a Workers invocation (CPython, tests) there is no budget: `current()` is
None, `spend()` does nothing, nothing is deferred. How calls are deferred is
`_turn.deferral`; the guide is docs/limits.md (Invocation budgets).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["PLANS", "InvocationBudget", "current", "invocation", "spend"]

# Per invocation: (subrequests, D1 queries), as Cloudflare's plans have them.
PLANS: dict[str, tuple[int, int]] = {"free": (50, 50), "paid": (10_000, 1_000)}
# What a step keeps for after its handlers: the next LLM call (a subrequest) and one
# spare; the D1 queries of the step's write of results, the turn's next load and its
# next writes.
RESERVED_SUBREQUESTS = 2
RESERVED_QUERIES = 10


@dataclass(slots=True)
class InvocationBudget:
    """The limits of one invocation and what it has used of them."""

    subrequests: int
    queries: int
    used_subrequests: int = 0
    used_queries: int = 0

    @classmethod
    def for_plan(cls, plan: str) -> InvocationBudget:
        subrequests, queries = PLANS[plan]
        return cls(subrequests, queries)

    def calls_that_fit(self) -> int:
        """How many tool calls this invocation can still start, one subrequest each,
        keeping what the turn needs after them (RESERVED_*)."""
        if self.queries - self.used_queries < RESERVED_QUERIES:
            return 0
        return max(0, self.subrequests - self.used_subrequests - RESERVED_SUBREQUESTS)


_CURRENT: contextvars.ContextVar[InvocationBudget | None] = contextvars.ContextVar(
    "durable_agents_invocation_budget", default=None
)


def current() -> InvocationBudget | None:
    """The budget of the invocation this code runs in (None outside Workers)."""
    return _CURRENT.get()


def spend(*, subrequests: int = 0, queries: int = 0) -> None:
    """Count what this invocation used (nothing happens without a budget)."""
    budget = _CURRENT.get()
    if budget is not None:
        budget.used_subrequests += subrequests
        budget.used_queries += queries


@contextlib.contextmanager
def invocation(budget: InvocationBudget | None) -> Iterator[InvocationBudget | None]:
    """Run the block (and the tasks it starts) under `budget`."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)
