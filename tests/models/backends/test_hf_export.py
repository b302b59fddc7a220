"""The embedded GGUF's cached Hugging Face folder: what every engine loads the embedded model from."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from prmloop.models.backends import hf_export
from prmloop.models.backends.embedded import smollm2_gguf_path
from prmloop.models.backends.hf_export import (
    COMPLETE_MARKER,
    embedded_smollm2_source,
    ensure_smollm2_folder,
    smollm2_folder,
)


@pytest.fixture
def counted_conversions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """The cache in ``tmp_path`` and a stand-in conversion (slow enough to overlap) that records its calls."""
    monkeypatch.setenv("PRMLOOP_MODEL_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.3)
        (out / "config.json").write_text("{}")
        (out / COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf)}))

    monkeypatch.setattr(hf_export, "_convert", convert)
    return calls


def test_the_folder_is_converted_once_by_concurrent_callers_and_then_found(counted_conversions: list[Path]) -> None:
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(ensure_smollm2_folder())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(counted_conversions) == 1
    assert found == [smollm2_folder()] * 4
    assert (smollm2_folder() / COMPLETE_MARKER).is_file()
    assert ensure_smollm2_folder() == smollm2_folder() and len(counted_conversions) == 1
    leftovers = [p.name for p in smollm2_folder().parent.iterdir() if p != smollm2_folder() and p.is_dir()]
    assert leftovers == []  # no temporary folder left behind


def test_an_interrupted_conversion_is_converted_again(counted_conversions: list[Path]) -> None:
    half = smollm2_folder()
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"half")  # no completion marker: cannot be trusted
    assert embedded_smollm2_source() == (str(half), None)
    assert len(counted_conversions) == 1
    assert not (half / "model.safetensors").exists() and (half / COMPLETE_MARKER).is_file()


def test_an_unwritable_cache_falls_back_to_the_gguf_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("PRMLOOP_MODEL_CACHE", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger=hf_export.__name__):
        source = embedded_smollm2_source()
    gguf = smollm2_gguf_path()
    assert source == (str(gguf.parent), gguf.name)
    assert "from its GGUF" in caplog.text and str(blocker) in caplog.text


@pytest.mark.integration
def test_the_converted_folder_holds_the_gguf_weights_bit_for_bit() -> None:
    """The folder (the shared cache, converted on first use) against a fresh de-quantisation of the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf_file = embedded_smollm2_source()
    assert gguf_file is None
    gguf = smollm2_gguf_path()
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    original = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    reference = original.state_dict()
    assert converted.keys() == reference.keys()
    assert all(torch.equal(converted[k], reference[k]) for k in reference)
    ours = AutoTokenizer.from_pretrained(folder)
    theirs = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    text = "Step 1: 3 + 4 = 7 apples.\n\nThe answer is \\boxed{7}.<|im_end|> ünïcode\t"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == theirs.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )
