CREATE TABLE IF NOT EXISTS agent_approvals (
    session_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    event TEXT NOT NULL CHECK (event IN ('requested', 'approved', 'denied', 'claimed')),
    tool_name TEXT NOT NULL,
    digest TEXT NOT NULL,
    reason TEXT,
    created_at INTEGER NOT NULL,
    UNIQUE (session_id, tool_call_id, event)
);

CREATE UNIQUE INDEX IF NOT EXISTS agent_approvals_one_decision
    ON agent_approvals (session_id, tool_call_id) WHERE event IN ('approved', 'denied');
