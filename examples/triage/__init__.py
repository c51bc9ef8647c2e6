"""The triage bot: the template agent (src/agent.py is a copy of agent.py)."""
