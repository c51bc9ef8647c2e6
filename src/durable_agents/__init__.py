"""durable-agents: LLM agents whose side-effecting tools run at most once, even across crashes.

    from durable_agents import Agent, run, tool
    from durable_agents.stores import sqlite_store

    result = await run(agent, llm=llm, message="...", session_id="s1", store=sqlite_store("a.db"))

See README.md for the contract and the crash-window table.
"""

from .agent import Agent
from .approvals import PendingApproval, approval_digest, approve, pending_approvals
from .errors import (
    ApprovalAlreadyDecidedError,
    ApprovalDigestMismatchError,
    ApprovalError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ConfigurationError,
    DurableAgentsError,
    MemoryStoreNotDurableError,
    MessageTooLargeError,
    RequestKeyReusedError,
    SessionBusyError,
    SessionConflictError,
    SessionNotFoundError,
    StoreError,
    ToolArgumentsError,
    ToolDurabilityError,
)
from .llm.base import LLM
from .messages import (
    LLMResponse,
    MalformedToolCall,
    Message,
    ToolCall,
    ToolErrorKind,
    ToolSpec,
    Usage,
)
from .run import RunResult, idempotency_key, pending_tool_calls, run
from .stores.base import SessionInfo, Store
from .tools import Tool, ToolContext, tool

__all__ = [
    "LLM",
    "Agent",
    "ApprovalAlreadyDecidedError",
    "ApprovalDigestMismatchError",
    "ApprovalError",
    "ApprovalNotFoundError",
    "ApprovalPendingError",
    "ConfigurationError",
    "DurableAgentsError",
    "LLMResponse",
    "MalformedToolCall",
    "MemoryStoreNotDurableError",
    "Message",
    "MessageTooLargeError",
    "PendingApproval",
    "RequestKeyReusedError",
    "RunResult",
    "SessionBusyError",
    "SessionConflictError",
    "SessionInfo",
    "SessionNotFoundError",
    "Store",
    "StoreError",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolContext",
    "ToolDurabilityError",
    "ToolErrorKind",
    "ToolSpec",
    "Usage",
    "approval_digest",
    "approve",
    "idempotency_key",
    "pending_approvals",
    "pending_tool_calls",
    "run",
    "tool",
]
