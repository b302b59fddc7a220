"""Shared fixtures for the model tests: the real SmolLM2 (``integration``), loaded once per session.
The shared data folder and the tiny random model live in ``tests/conftest.py`` (used beyond models/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from prmloop.models.backends.transformers_backend import TransformersBackend


@pytest.fixture(scope="session")
def smollm2_backend() -> TransformersBackend:
    """The real embedded SmolLM2-135M-Instruct (GGUF de-quantised to float32; about 12 s to load)."""
    from prmloop.models.backends.transformers_backend import TransformersBackend

    # One thread: the CPUs here are shared, and oversubscribed torch threads decode ten times slower.
    return TransformersBackend.from_pretrained("smollm2", max_batch_size=16, num_threads=1)
