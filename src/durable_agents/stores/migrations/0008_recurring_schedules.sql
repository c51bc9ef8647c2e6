ALTER TABLE agent_schedules ADD COLUMN rule TEXT;

DROP TRIGGER IF EXISTS agent_messages_scheduled_once;

CREATE TRIGGER IF NOT EXISTS agent_messages_scheduled_occurrence
BEFORE INSERT ON agent_messages
WHEN NEW.origin = 'scheduled' AND NEW.role = 'user' AND NOT EXISTS (
    SELECT 1 FROM agent_schedules WHERE session_id = NEW.session_id
    AND 'schedule:' || schedule_id || CASE WHEN rule IS NULL THEN '' ELSE '@' || due_at END
        = NEW.request_key
)
BEGIN
    SELECT RAISE(ABORT, 'agent_messages: the schedule was cancelled or has fired already');
END;
