"""Benchmarks (``prmloop bench``) and evaluations (``prmloop eval``): a leaf that nothing in production
imports; it may import every other room."""
