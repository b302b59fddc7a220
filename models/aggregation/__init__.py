"""Aggregation of PRM scores and votes over Best-of-N pools (majority, Best-of-N, weighted votes, HMR,
WRF, calibrated Logit/Linear/KDE weighting, bounds) and their calibration and evaluation.

Modules: ``methods`` (pure vectorized rules), ``pool`` (arrays of a pool), ``loader`` (pool files ->
arrays), ``calibration`` (the fitted record), ``selection`` (method registry), ``naive`` (per-question
reference loop), ``evaluation`` (accuracy vs N, compute fraction), ``plots`` (PNG figures).
"""
