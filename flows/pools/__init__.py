"""Pools of solutions with exact first errors, sampled once through the engine and cached in the home:
the loop's held-out set and the active bench's pools (their items: :mod:`prmloop.models.prm.pool_items`)."""
