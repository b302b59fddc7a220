"""The in-process vLLM backend's contract on the real engine and the embedded SmolLM2.

These run inside ``.venv-vllm`` (vLLM cannot share the project's environment):
``tests/models/backends/test_vllm_engine.py`` starts them there with ``--noconftest`` (the suite's conftest needs
Kafka and Prefect, which that environment lacks), so the main run does not collect this folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from prmloop.models.backends.base import Generator, SamplingParams, Scorer
from prmloop.models.backends.vllm_backend import VLLMBackend

PROMPT = "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:"
FEW_SHOT = "Q: 2 + 3?\nA: The answer is 5.\nQ: 4 + 4?\nA: The answer is 8.\nQ: 1 + 6?\nA:"


@pytest.fixture(scope="module")
def backend() -> Iterator[VLLMBackend]:
    engine = VLLMBackend.from_model("smollm2", max_model_len=2048)
    try:
        yield engine
    finally:
        engine.unload()


def test_it_implements_the_generator_and_scorer_protocols(backend: VLLMBackend) -> None:
    assert isinstance(backend, Generator) and isinstance(backend, Scorer)
    assert backend.model_name.startswith("smollm2:")


def test_generate_returns_n_completions_per_prompt_in_order_with_a_logprob_per_token(backend: VLLMBackend) -> None:
    prompts = [PROMPT, FEW_SHOT, "Step 1:"]
    results = backend.generate(prompts, SamplingParams(n=3, max_new_tokens=12, temperature=0.8, seed=1))
    assert [len(r) for r in results] == [3, 3, 3]
    for prompt, completions in zip(prompts, results, strict=True):
        for completion in completions:
            assert completion.prompt_tokens == len(backend.encode_prompt(prompt))
            assert 0 < len(completion.token_ids) == len(completion.logprobs) <= 12
            assert all(lp <= 0.0 for lp in completion.logprobs)
            assert completion.finish_reason in ("stop", "length")


def test_sampled_logprobs_equal_the_engines_own_teacher_forced_scores(backend: VLLMBackend) -> None:
    rollouts = backend.rollouts(PROMPT, 6, SamplingParams(max_new_tokens=16, temperature=1.0, seed=0))
    assert len(rollouts) == 6
    compared = 0
    for completion in rollouts:
        [scored] = backend.score([(PROMPT, backend.tokenizer.decode(list(completion.token_ids)))])
        if scored.token_ids == completion.token_ids:  # the text re-tokenises to the sampled ids
            compared += 1
            assert max(abs(a - b) for a, b in zip(scored.logprobs, completion.logprobs, strict=True)) < 1e-3
    assert compared > 0


def test_a_seeded_greedy_call_is_reproducible(backend: VLLMBackend) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    assert backend.generate([PROMPT], params) == backend.generate([PROMPT], params)


def test_a_stop_string_ends_the_text_before_it(backend: VLLMBackend) -> None:
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    [[full]] = backend.generate([FEW_SHOT], greedy)
    assert "\n" in full.text, full.text
    [[stopped]] = backend.generate([FEW_SHOT], greedy.model_copy(update={"stop": ("\n",)}))
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", "\n")
    assert stopped.text == full.text[: full.text.index("\n")]


def test_the_answer_stop_keeps_the_answer_and_the_tokens_before_its_end(backend: VLLMBackend) -> None:
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    [[full]] = backend.generate([FEW_SHOT], greedy)
    [[cut]] = backend.generate([FEW_SHOT], greedy.model_copy(update={"stop_at_answer": True}))
    assert "The answer is" in full.text and len(full.text) > len(cut.text), full.text
    assert (cut.finish_reason, cut.stop_reason) == ("stop", "answer")
    assert cut.text.rstrip().endswith(".") and full.text.startswith(cut.text)
    assert backend.tokenizer.decode(list(cut.token_ids)).startswith(cut.text)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < len(full.token_ids)


def test_rollouts_reuse_the_prefix_blocks_a_previous_call_cached(backend: VLLMBackend) -> None:
    import vllm

    prefix = FEW_SHOT * 6  # several full KV blocks
    ids = backend.encode_prompt(prefix)
    sampling = vllm.SamplingParams(n=4, max_tokens=4, temperature=1.0, seed=3)
    backend.llm.generate([{"prompt_token_ids": ids}], sampling, use_tqdm=False)
    [again] = backend.llm.generate([{"prompt_token_ids": ids}], sampling, use_tqdm=False)
    assert again.num_cached_tokens >= len(ids) // 2  # the prefix's full KV blocks came from the cache


def test_scoring_refuses_an_empty_prompt(backend: VLLMBackend) -> None:
    with pytest.raises(ValueError, match="non-empty prompt"):
        backend.score([("", "x")])


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_on_a_cpu_the_model_runs_in_this_process(backend: VLLMBackend) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU vLLM keeps its own executor")
    # No worker process for the engine to wait on spinning (cpu_executor), so no child at all.
    assert backend.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend == "uni"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert _children(os.getpid()) == []
