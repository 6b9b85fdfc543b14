"""The Run ledger (issue 41): what the gateway told the agent, on a public append-only log."""
