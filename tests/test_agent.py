"""Your agent (src/agent.py) against the at-most-once contract, at every crash point.

Replace src/agent.py with your own agent and this still runs it: see
`durable_agents.testing.check_agent` for what is checked.
"""

import importlib

from durable_agents.testing import check_agent


def test_agent_keeps_the_contract_at_every_crash_point() -> None:
    print(check_agent(importlib.import_module("agent")))
