CREATE TABLE IF NOT EXISTS agent_sessions (
    id TEXT PRIMARY KEY NOT NULL,
    agent_name TEXT,
    state TEXT NOT NULL,
    message_count INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS agent_messages (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content TEXT NOT NULL,
    tool_call_id TEXT,
    tool_name TEXT,
    tool_calls TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    request_key TEXT,
    created_at INTEGER NOT NULL,
    UNIQUE (session_id, seq)
);

CREATE UNIQUE INDEX IF NOT EXISTS agent_messages_one_result_per_call
    ON agent_messages (session_id, tool_call_id) WHERE role = 'tool';

CREATE UNIQUE INDEX IF NOT EXISTS agent_messages_one_turn_per_request_key
    ON agent_messages (session_id, request_key) WHERE request_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS agent_sessions_by_update
    ON agent_sessions (updated_at);

CREATE TRIGGER IF NOT EXISTS agent_messages_append_only_in_order
BEFORE INSERT ON agent_messages
WHEN NEW.seq > 0 AND NOT EXISTS (
    SELECT 1 FROM agent_messages WHERE session_id = NEW.session_id AND seq = NEW.seq - 1
)
BEGIN
    SELECT RAISE(ABORT, 'agent_messages: seq must directly follow the last stored message');
END;
