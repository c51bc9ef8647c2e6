ALTER TABLE agent_sessions ADD COLUMN name TEXT;

ALTER TABLE agent_sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;

ALTER TABLE agent_sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;

UPDATE agent_sessions SET name = COALESCE(name, id),
    input_tokens = (SELECT COALESCE(SUM(m.input_tokens), 0) FROM agent_messages AS m
        WHERE m.session_id = agent_sessions.id),
    output_tokens = (SELECT COALESCE(SUM(m.output_tokens), 0) FROM agent_messages AS m
        WHERE m.session_id = agent_sessions.id);

CREATE INDEX IF NOT EXISTS agent_sessions_by_creation
    ON agent_sessions (created_at, id);

CREATE INDEX IF NOT EXISTS agent_sessions_by_name
    ON agent_sessions (name, created_at, id);
