"""Specification of the vLLM backend: the output conversion always, the engine where vLLM and a GPU exist."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace

import pytest

from prmloop.models.backends.base import SamplingParams
from prmloop.models.backends.registry import build_backend
from prmloop.models.backends.vllm_backend import completion_from_vllm

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class _Logprob:
    logprob: float


@dataclass(frozen=True)
class _Output:
    """The fields of ``vllm.CompletionOutput`` the conversion reads (vLLM itself is not installed here)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: list[dict[int, _Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


def test_conversion_reads_the_sampled_tokens_logprobs_by_id() -> None:
    output = _Output(
        text=" 4",
        token_ids=(7, 2),
        logprobs=[{7: _Logprob(-0.5), 9: _Logprob(-0.1)}, {2: _Logprob(-0.25)}],
        finish_reason="stop",
        stop_reason=None,
    )
    completion = completion_from_vllm(output, prompt_tokens=5)
    assert (completion.token_ids, completion.logprobs) == ((7, 2), (-0.5, -0.25))
    assert (completion.finish_reason, completion.stop_reason, completion.prompt_tokens) == ("stop", None, 5)


def test_conversion_keeps_a_stop_string_but_not_a_stop_token_id() -> None:
    base = _Output(text="x", token_ids=(3,), logprobs=[{3: _Logprob(-1.0)}], finish_reason="stop")
    assert completion_from_vllm(replace(base, stop_reason="\n\n"), 1).stop_reason == "\n\n"
    assert completion_from_vllm(replace(base, stop_reason=2), 1).stop_reason is None


def test_conversion_refuses_outputs_without_logprobs() -> None:
    with pytest.raises(ValueError, match="logprobs=0"):
        completion_from_vllm(_Output(text="", token_ids=(), logprobs=None, finish_reason="length"), 1)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed; the missing-dependency message cannot be shown")
def test_building_without_vllm_says_how_to_install_it() -> None:
    with pytest.raises(ImportError, match="make vllm"):
        build_backend({"backend": "vllm", "model": "smollm2"})


@pytest.mark.integration
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (optional 'gpu' extra)")
def test_vllm_logprobs_match_its_own_teacher_forced_scores() -> None:
    if not _has_cuda():
        pytest.skip("vLLM is installed but no CUDA GPU is visible")
    from prmloop.models.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend.from_model("smollm2", dtype="float32", gpu_memory_utilization=0.3)
    try:
        prompt = "Question: what is 2 + 2?\nAnswer:"
        rollouts = backend.rollouts(prompt, 8, SamplingParams(max_new_tokens=16, seed=0))
        assert len(rollouts) == 8
        for completion in rollouts:
            [scored] = backend.score([(prompt, backend.tokenizer.decode(list(completion.token_ids)))])
            if scored.token_ids == completion.token_ids:
                assert max(abs(a - b) for a, b in zip(scored.logprobs, completion.logprobs, strict=True)) < 1e-3
    finally:
        backend.unload()
