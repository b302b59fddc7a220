"""Shared fixtures for the model tests: the shared data folder and the real SmolLM2 (``integration``),
loaded once per session. The tiny random model lives in ``tests/conftest.py`` (used beyond models/)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from prmloop.models.questions import data_dir

if TYPE_CHECKING:
    from prmloop.models.backends.transformers_backend import TransformersBackend


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared data folder; tests that read it are skipped (with the reason) where it is absent."""
    root = data_dir()
    if not (root / "MANIFEST.md").is_file():
        pytest.skip(f"shared data folder {root} not found; set PRMLOOP_DATA_DIR to it")
    return root


@pytest.fixture(scope="session")
def smollm2_backend() -> TransformersBackend:
    """The real embedded SmolLM2-135M-Instruct (GGUF de-quantised to float32; about 12 s to load)."""
    from prmloop.models.backends.transformers_backend import TransformersBackend

    # One thread: the CPUs here are shared, and oversubscribed torch threads decode ten times slower.
    return TransformersBackend.from_pretrained("smollm2", max_batch_size=16, num_threads=1)
