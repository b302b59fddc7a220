"""Step annotation: the Monte-Carlo estimators (hard MC, MC-PPL) and the search strategies that find
the first wrong step (sequential, binary, EpicPRM adaptive binary, UnPRM uncertainty-driven)."""
