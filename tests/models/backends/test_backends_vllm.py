"""Specification of the vLLM backend's output conversion (the engine itself: tests/vllm_env, run inside
.venv-vllm by tests/models/backends/test_vllm_engine.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace

import pytest

from prmloop.models.backends.registry import build_backend
from prmloop.models.backends.vllm_backend import completion_from_vllm

HAS_VLLM = importlib.util.find_spec("vllm") is not None


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
