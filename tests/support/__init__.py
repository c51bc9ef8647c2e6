"""What the kit's own tests share: fake services served over real HTTP, dev servers and
other Workers started for a test, crash sweeps, history checks, the child processes of
the process tests. Imported as `tests.support.<module>` (the repository's root is on
pytest's `pythonpath`); none of it ships with the kit (a user's tests have
`durable_agents.testing`, docs/testing.md)."""
