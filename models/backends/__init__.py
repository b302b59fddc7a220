"""Language-model engines behind one interface: transformers, vLLM and OpenAI-compatible HTTP."""
