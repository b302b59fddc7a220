"""Combining PRM scores and votes: majority, Best-of-N, weighted votes, HMR, WRF, and calibrated
Logit/Linear/KDE weighting."""
