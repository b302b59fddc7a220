"""Everything that runs or fits a model: generator/completer/judge backends, answer grading, PRM
scoring and training, aggregation and calibration."""
