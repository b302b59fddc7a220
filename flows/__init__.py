"""Bounded jobs as Prefect flows (sample, retrain, calibrate, prioritize, the whole loop) and the
``prmloop`` command line."""
