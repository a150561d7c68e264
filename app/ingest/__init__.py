"""Ingest: the agents' push (validated and stored) and the command long-poll that hands them
rollouts and A/B steps."""
