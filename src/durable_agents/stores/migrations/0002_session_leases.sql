CREATE TABLE IF NOT EXISTS agent_leases (
    session_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
