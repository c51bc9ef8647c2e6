"""What `run()` returns: `RunResult` and its `RunStatus`.

A module of its own so that the run loop (`durable_agents.run`) and what it
reports (`durable_agents.events`, whose `RunFinished` carries a result) share
the type without importing each other. The statuses are explained in
docs/contract.md and docs/python-api.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal

from ..agent import OutputT
from ..approvals import PendingApproval
from ..messages import Message, Usage

__all__ = ["RunResult", "RunStatus"]

RunStatus = Literal[
    "complete",
    "max_steps",
    "error",
    "awaiting_approval",
    "cancelled",
    "budget_exceeded",
    "deferred",
]


@dataclass(frozen=True, slots=True)
class RunResult(Generic[OutputT]):
    """What `run()` returns.

    `status` is `"complete"` (the LLM gave a final reply, in `response`),
    `"max_steps"` (stopped after `agent.max_steps` LLM calls), `"error"`
    (the LLM call failed; `error` says why), `"awaiting_approval"` (calls
    of tools declared `requires_approval` wait for a person's decision; they
    are in `pending`, see `durable_agents.approvals`) or `"cancelled"` (its
    `CancelToken` was cancelled; it stopped at a step boundary) or
    `"budget_exceeded"` (the session's stored usage reached
    `agent.max_session_tokens` before an LLM call; `error` says how far) or
    `"deferred"` (inside a Workers invocation, `durable_agents.budget`: a step's
    calls did not all fit what the invocation may still fetch; those that did ran,
    the others are recorded as not started, and `message=None` in a fresh
    invocation runs them: the session's Durable Object does that at once).
    With `"error"`, `error_code` says which: `"llm-error"` (the call failed),
    `"llm-response-too-large"` (the reply is over the store's limit for one
    message, `MAX_ROW_BYTES`, so it was not kept), `"toolset-error"` (a toolset,
    e.g. an MCP server, could not list its tools), `"configuration"` (a toolset
    could not list its tools for want of a setting: `error` names it and where it
    is set) or `"invalid-output"` (the
    model's answer broke `agent.output_type` more than `max_output_retries`
    times). In every
    case but the first the stored history is consistent and
    `run(..., message=None)` continues the turn (once waiting calls are decided).
    `messages` is the whole conversation as the LLM sees it, system message
    first. `steps` counts this run's LLM calls and `usage` their tokens.
    `output` is the typed answer of an agent with `output_type` (status
    `"complete"`; None otherwise): the final message's JSON, validated.
    """

    status: RunStatus
    response: str
    session_id: str
    messages: list[Message]
    steps: int
    usage: Usage
    error: str | None = None
    pending: list[PendingApproval] = field(default_factory=list)
    error_code: str | None = None
    output: OutputT | None = None
