"""Several agents: a support agent that hands refunds and research to two others."""
