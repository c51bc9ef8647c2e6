"""durable-agents: LLM agents whose side-effecting tools run at most once, even across crashes.

    from durable_agents import Agent, run, tool
    from durable_agents.stores import sqlite_store

    result = await run(agent, llm=llm, message="...", session_id="s1", store=sqlite_store("a.db"))

See docs/contract.md for the contract and the crash-window table.
"""

from .agent import Agent
from .agent_tools import AgentRunner, AgentTurn, AgentTurnOutcome, LocalAgent, agent_tool
from .approvals import PendingApproval, approval_digest, approve, pending_approvals
from .errors import (
    ApprovalAlreadyDecidedError,
    ApprovalDigestMismatchError,
    ApprovalError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ConfigurationError,
    DurableAgentsError,
    InvalidCursorError,
    MemoryStoreNotDurableError,
    MessageTooLargeError,
    ModelRetry,
    RequestKeyReusedError,
    ScheduleError,
    SessionBusyError,
    SessionConflictError,
    SessionNotFoundError,
    StoreError,
    ToolArgumentsError,
    ToolDurabilityError,
    ToolFailure,
    ToolsetError,
)
from .events import CancelToken, ChildEvent, MessageStored, RunEvent, RunFinished
from .llm.base import LLM, StreamingLLM
from .messages import (
    LLMResponse,
    MalformedToolCall,
    Message,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolErrorKind,
    ToolSpec,
    Usage,
)
from .run import RunResult, idempotency_key, pending_tool_calls, run, stop_turn
from .schedules import schedule
from .stores.base import Schedule, SessionInfo, SessionPage, Store
from .tools import RunContext, Tool, ToolContext, Toolset, tool

__all__ = [
    "LLM",
    "Agent",
    "AgentRunner",
    "AgentTurn",
    "AgentTurnOutcome",
    "ApprovalAlreadyDecidedError",
    "ApprovalDigestMismatchError",
    "ApprovalError",
    "ApprovalNotFoundError",
    "ApprovalPendingError",
    "CancelToken",
    "ChildEvent",
    "ConfigurationError",
    "DurableAgentsError",
    "InvalidCursorError",
    "LLMResponse",
    "LocalAgent",
    "MalformedToolCall",
    "MemoryStoreNotDurableError",
    "Message",
    "MessageStored",
    "MessageTooLargeError",
    "ModelRetry",
    "PendingApproval",
    "RequestKeyReusedError",
    "RunContext",
    "RunEvent",
    "RunFinished",
    "RunResult",
    "Schedule",
    "ScheduleError",
    "SessionBusyError",
    "SessionConflictError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionPage",
    "Store",
    "StoreError",
    "StreamingLLM",
    "TextDelta",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallDelta",
    "ToolContext",
    "ToolDurabilityError",
    "ToolErrorKind",
    "ToolFailure",
    "ToolSpec",
    "Toolset",
    "ToolsetError",
    "Usage",
    "agent_tool",
    "approval_digest",
    "approve",
    "idempotency_key",
    "pending_approvals",
    "pending_tool_calls",
    "run",
    "schedule",
    "stop_turn",
    "tool",
]
