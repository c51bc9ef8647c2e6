ALTER TABLE agent_messages ADD COLUMN instructions TEXT;

ALTER TABLE agent_approvals ADD COLUMN arguments TEXT
    CHECK (arguments IS NULL OR event = 'approved');

ALTER TABLE agent_approvals ADD COLUMN arguments_digest TEXT
    CHECK ((arguments_digest IS NULL) = (arguments IS NULL));
