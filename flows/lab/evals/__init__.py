"""Evaluations against the shared data sets (``prmloop eval ...``)."""
