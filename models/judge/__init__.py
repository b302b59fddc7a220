"""An LLM as a judge of solution steps: the step-wise CoT verifier with its uncertainty (CoT Entropy
paper) and the whole-solution critic of the ProcessBench protocol (Qwen "Lessons", appendix)."""
