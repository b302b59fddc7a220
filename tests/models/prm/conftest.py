"""A fresh tiny causal LM per test module: LoRA is injected in place, so the shared one is not used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def tiny_lm(smollm2_tokenizer: Any) -> Callable[[], Any]:
    """Build a random 2-layer Llama over SmolLM2's vocabulary (the same weights for the same seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(seed: int = 0) -> Any:
        config = LlamaConfig(
            vocab_size=len(smollm2_tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            pad_token_id=smollm2_tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)

    return build
