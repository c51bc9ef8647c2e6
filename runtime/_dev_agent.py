"""The dev server's look at the agent module, inside the runtime: which settings it
reads and which dev stubs it has (runtime/dev-server.mjs knows no agent itself).

Only the dev server imports this module; it runs inside Pyodide.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys


def load(path: str | None = None) -> str:
    """Import the agent module (the file at `path` as `agent`, else `agent` from src/),
    check it against the protocol, and describe it as JSON."""
    if path is None:
        module = importlib.import_module("agent")
    else:
        spec = importlib.util.spec_from_file_location("agent", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules["agent"] = module  # what src/entry.py's `import agent` then finds
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["agent"]
            raise
    from durable_agents.cloudflare.agent_module import AgentModule

    return json.dumps(AgentModule.load(module).describe())
