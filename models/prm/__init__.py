"""Process reward models: the training data format, LoRA training (UnPRM's step-tag formulation and a
classification head), one-pass scoring, a scorer for published PRMs (Qwen2.5-Math-PRM), and the
ProcessBench protocol."""
