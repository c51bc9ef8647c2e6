"""The rooms of one turn, each called by the run loop (`durable_agents.run`), which keeps
the two-write contract itself; the guide is docs/contract.md, the map docs/architecture.md.

    setup              the turn's message checked, its tools bound, its instructions made
    llm_call           asking the model (streaming, cancel, the history processor)
    session_log        the loaded history and the one atomic append
    tool_execution     running the calls, and the results the model sees
    approval_settling  decided approvals at resume: claim, run, deny, answer
    output_retries     typed answers: accepted, or sent back
    deferral           calls past the Workers invocation budget, for the next invocation
    compaction         summarising an old history into the context window
    leases             one runner per session (CPython hosts)
    ids                call ids and idempotency keys
    delegation         agent tools: who runs the child's turn, its depth, its usage
    run_result         RunResult, shared by the loop and the events

Nothing here imports `run`; nothing is imported at package import.
"""
