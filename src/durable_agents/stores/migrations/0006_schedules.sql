ALTER TABLE agent_messages ADD COLUMN origin TEXT;

CREATE TABLE IF NOT EXISTS agent_schedules (
    session_id TEXT NOT NULL,
    schedule_id TEXT NOT NULL,
    message TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, schedule_id)
);

CREATE INDEX IF NOT EXISTS agent_schedules_by_due
    ON agent_schedules (due_at, session_id);

CREATE TRIGGER IF NOT EXISTS agent_messages_scheduled_once
BEFORE INSERT ON agent_messages
WHEN NEW.origin = 'scheduled' AND NEW.role = 'user' AND NOT EXISTS (
    SELECT 1 FROM agent_schedules WHERE session_id = NEW.session_id
    AND 'schedule:' || schedule_id = NEW.request_key
)
BEGIN
    SELECT RAISE(ABORT, 'agent_messages: the schedule was cancelled or has fired already');
END;
