"""Benchmarks: each ``prmloop bench ...`` command prints one JSON line; ``synthetic`` makes realistic test streams."""
