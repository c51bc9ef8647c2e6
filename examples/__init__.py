"""Complete agent modules built on the kit: copy one to src/agent.py to serve it."""
