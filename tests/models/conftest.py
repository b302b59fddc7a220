"""Shared fixtures for the model tests: the shared data folder (real files, never copied)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prmloop.models.questions import data_dir


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared data folder; tests that read it are skipped (with the reason) where it is absent."""
    root = data_dir()
    if not (root / "MANIFEST.md").is_file():
        pytest.skip(f"shared data folder {root} not found; set PRMLOOP_DATA_DIR to it")
    return root
