ALTER TABLE agent_messages ADD COLUMN summary_of INTEGER;

CREATE INDEX IF NOT EXISTS agent_messages_summaries
    ON agent_messages (session_id, seq) WHERE summary_of IS NOT NULL;
