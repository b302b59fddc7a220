"""Turning questions into ``solutions.sampled`` events: sampling, token-level uncertainty and
uncertainty-driven selection."""
