"""Specification of the in-process transformers backend, on a tiny random Llama with SmolLM2's tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from prmloop.models.backends.base import Completion, Generator, SamplingParams, Scorer
from prmloop.models.backends.transformers_backend import TransformersBackend

PROMPTS = ["Question: what is 2 + 2?\nAnswer:", "Step 1: Let x be the number of apples. Step 2:"]


def _max_abs_diff(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def _forward_logprobs(backend: TransformersBackend, prompt: str, completion: Completion) -> tuple[float, ...]:
    prompt_ids = backend.tokenizer.encode(prompt, add_special_tokens=False)
    [scored] = backend.score_ids([(prompt_ids, completion.token_ids)])
    return scored.logprobs


def test_backend_implements_the_generator_and_scorer_protocols(tiny_backend: TransformersBackend) -> None:
    assert isinstance(tiny_backend, Generator)
    assert isinstance(tiny_backend, Scorer)


def test_generate_returns_n_completions_per_prompt_with_one_logprob_per_token(
    tiny_backend: TransformersBackend,
) -> None:
    results = tiny_backend.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=12, seed=0))
    assert [len(completions) for completions in results] == [3, 3]
    for prompt, completions in zip(PROMPTS, results, strict=True):
        prompt_tokens = len(tiny_backend.tokenizer.encode(prompt, add_special_tokens=False))
        for completion in completions:
            assert completion.prompt_tokens == prompt_tokens
            assert 1 <= completion.completion_tokens <= 12
            assert len(completion.logprobs) == completion.completion_tokens
            assert all(lp <= 0.0 for lp in completion.logprobs)
            expected = "length" if completion.completion_tokens == 12 else "stop"
            assert completion.finish_reason == expected


def test_sampled_token_logprobs_equal_a_forward_pass_despite_padding_temperature_and_top_p(
    tiny_backend: TransformersBackend,
) -> None:
    params = SamplingParams(n=2, max_new_tokens=10, temperature=0.7, top_p=0.9, seed=3)
    results = tiny_backend.generate(PROMPTS, params)
    for prompt, completions in zip(PROMPTS, results, strict=True):
        for completion in completions:
            assert _max_abs_diff(completion.logprobs, _forward_logprobs(tiny_backend, prompt, completion)) < 1e-4


def test_the_same_seed_reproduces_the_same_samples(tiny_backend: TransformersBackend) -> None:
    params = SamplingParams(n=2, max_new_tokens=8, seed=11)
    first = tiny_backend.generate(PROMPTS, params)
    again = tiny_backend.generate(PROMPTS, params)
    other = tiny_backend.generate(PROMPTS, params.model_copy(update={"seed": 12}))
    assert first == again
    assert [[c.token_ids for c in cs] for cs in first] != [[c.token_ids for c in cs] for cs in other]


def test_a_seeded_call_leaves_the_global_random_state_alone(tiny_backend: TransformersBackend) -> None:
    import torch

    state = torch.get_rng_state()
    tiny_backend.generate(PROMPTS[:1], SamplingParams(max_new_tokens=3, seed=99))
    assert torch.equal(torch.get_rng_state(), state)


def test_greedy_decoding_is_deterministic_without_a_seed(tiny_backend: TransformersBackend) -> None:
    params = SamplingParams(n=3, max_new_tokens=8, temperature=0.0)
    [completions] = tiny_backend.generate(PROMPTS[:1], params)
    assert len({c.token_ids for c in completions}) == 1
    assert tiny_backend.generate(PROMPTS[:1], params) == [completions]


@pytest.mark.parametrize("params", [SamplingParams(top_p=1e-6), SamplingParams(temperature=1e-4)])
def test_top_p_and_temperature_shape_sampling(tiny_backend: TransformersBackend, params: SamplingParams) -> None:
    greedy = tiny_backend.rollouts(PROMPTS[0], 1, SamplingParams(temperature=0.0, max_new_tokens=8))
    sampled = tiny_backend.rollouts(PROMPTS[0], 4, params.model_copy(update={"max_new_tokens": 8, "seed": 5}))
    assert {c.token_ids for c in sampled} == {greedy[0].token_ids}


def _count_generate_calls(backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on the real ``model.generate`` and record the batch size of each call."""
    calls: list[int] = []
    real_generate: Callable[..., Any] = backend.model.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(int(kwargs["input_ids"].shape[0]) * kwargs["generation_config"].num_return_sequences)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(backend.model, "generate", spy)
    return calls


def test_n_rollouts_of_one_prefix_share_one_batched_call(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_generate_calls(tiny_backend, monkeypatch)
    rollouts = tiny_backend.rollouts(PROMPTS[1], 8, SamplingParams(max_new_tokens=6, seed=0))
    assert calls == [8]
    assert len(rollouts) == 8
    assert len({c.token_ids for c in rollouts}) > 1


def test_batched_rollouts_match_one_at_a_time(tiny_backend: TransformersBackend) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    batched = tiny_backend.rollouts(PROMPTS[1], 4, greedy)
    single = [tiny_backend.rollouts(PROMPTS[1], 1, greedy)[0] for _ in range(4)]
    assert [c.token_ids for c in batched] == [c.token_ids for c in single]
    for b, s in zip(batched, single, strict=True):
        assert _max_abs_diff(b.logprobs, s.logprobs) < 1e-4
    # Sampled rollouts, batched or not, are draws from the same model distribution.
    sampling = SamplingParams(max_new_tokens=6, seed=2)
    batched = tiny_backend.rollouts(PROMPTS[1], 4, sampling)
    single = [tiny_backend.rollouts(PROMPTS[1], 1, sampling.model_copy(update={"seed": i}))[0] for i in range(4)]
    for completion in [*batched, *single]:
        assert completion.completion_tokens == 6
        assert _max_abs_diff(completion.logprobs, _forward_logprobs(tiny_backend, PROMPTS[1], completion)) < 1e-4


def test_prefix_sharing_samples_exactly_what_copying_the_prompts_samples(tiny_backend: TransformersBackend) -> None:
    copying = TransformersBackend(
        tiny_backend.model, tiny_backend.tokenizer, model_name="tiny-copying", share_prefix=False, num_threads=1
    )
    params = SamplingParams(n=3, max_new_tokens=8, temperature=0.9, seed=4)
    shared, copied = tiny_backend.generate(PROMPTS, params), copying.generate(PROMPTS, params)
    for shared_row, copied_row in zip(shared, copied, strict=True):
        assert [c.token_ids for c in shared_row] == [c.token_ids for c in copied_row]
        for a, b in zip(shared_row, copied_row, strict=True):
            assert _max_abs_diff(a.logprobs, b.logprobs) < 1e-4


def test_batches_are_split_at_max_batch_size(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_generate_calls(tiny_backend, monkeypatch)
    results = tiny_backend.generate(PROMPTS * 3, SamplingParams(n=6, max_new_tokens=2, seed=0))
    assert [len(c) for c in results] == [6] * 6
    assert calls == [12, 12, 12]
    calls.clear()
    assert len(tiny_backend.rollouts(PROMPTS[0], 20, SamplingParams(max_new_tokens=2, seed=0))) == 20
    assert calls == [16, 4]


def test_a_stop_string_ends_the_completion_before_it(tiny_backend: TransformersBackend) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    [full] = tiny_backend.rollouts(PROMPTS[0], 1, greedy)
    stop = tiny_backend.tokenizer.decode(full.token_ids[4:6])
    assert stop.strip(), "the greedy continuation should contain printable text"
    [stopped] = tiny_backend.rollouts(PROMPTS[0], 1, greedy.model_copy(update={"stop": (stop,)}))
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    assert stopped.text == full.text[: full.text.index(stop)]
    assert stopped.token_ids == full.token_ids[: stopped.completion_tokens]
    assert stopped.completion_tokens <= 6


def test_score_tokenizes_prompt_and_continuation_separately(tiny_backend: TransformersBackend) -> None:
    prompt, continuation = PROMPTS[0], " 4. The answer is 4."
    [scored] = tiny_backend.score([(prompt, continuation)])
    tokenizer = tiny_backend.tokenizer
    assert scored.token_ids == tuple(tokenizer.encode(continuation, add_special_tokens=False))
    assert scored.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    [again] = tiny_backend.score_ids([(tokenizer.encode(prompt, add_special_tokens=False), scored.token_ids)])
    assert _max_abs_diff(scored.logprobs, again.logprobs) < 1e-5
    assert scored.perplexity > 1.0


def test_scoring_a_batch_equals_scoring_one_at_a_time(tiny_backend: TransformersBackend) -> None:
    pairs = [(PROMPTS[0], " 4"), (PROMPTS[1], " Each apple costs 3 dollars, so 5 apples cost 15."), ("x", "y")]
    batched = tiny_backend.score(pairs)
    for pair, scored in zip(pairs, batched, strict=True):
        assert _max_abs_diff(scored.logprobs, tiny_backend.score([pair])[0].logprobs) < 1e-4


def test_scoring_without_a_prompt_is_refused(tiny_backend: TransformersBackend) -> None:
    with pytest.raises(ValueError, match="non-empty prompt"):
        tiny_backend.score([("", "text")])


def test_generate_refuses_a_bare_string(tiny_backend: TransformersBackend) -> None:
    with pytest.raises(TypeError, match="sequence of prompts"):
        tiny_backend.generate("a prompt")


def test_bench_generate_compares_wrapper_and_raw_on_the_same_prompts(tiny_backend: TransformersBackend) -> None:
    from prmloop.flows.lab.bench.generate import bench_generate

    result = bench_generate(True, backend=tiny_backend, n_prompts=2, max_new_tokens=4, n_rollouts=2)
    assert result["raw_tokens"] == result["wrapper_tokens"] == 8, "same seed and settings: the same tokens"
    assert result["raw_tokens_per_s"] > 0 and result["wrapper_tokens_per_s"] > 0
    assert result["wrapper_to_raw_ratio"] == pytest.approx(
        result["wrapper_tokens_per_s"] / result["raw_tokens_per_s"], rel=1e-2
    )
    assert result["batched_rollout_speedup"] > 0


def test_concurrent_rollouts_are_coalesced_into_one_engine_call(tiny_backend: TransformersBackend) -> None:
    import threading

    from prmloop.models.backends.coalesce import CoalescingGenerator

    calls: list[int] = []
    real = tiny_backend.generate

    def counting(prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        calls.append(len(prompts))
        return real(prompts, params)

    tiny_backend.generate = counting  # type: ignore[method-assign]
    try:
        engine = CoalescingGenerator(tiny_backend, expected=3, window_s=5.0)
        params = SamplingParams(n=2, max_new_tokens=4, temperature=1.0, seed=1)
        out: dict[int, list[Completion]] = {}

        def ask(i: int) -> None:
            out[i] = engine.rollouts(f"prefix number {i}:", 2, params)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        # Three requests, one engine call over three prompts, two completions each, to the right caller.
        assert calls == [3] and engine.calls == 1 and engine.batched_requests == 3
        assert sorted(out) == [0, 1, 2] and all(len(c) == 2 for c in out.values())
        # Different n cannot share a call: two groups.
        engine.expected = 2
        other = SamplingParams(n=1, max_new_tokens=4, temperature=1.0, seed=1)
        pair = [
            threading.Thread(target=engine.rollouts, args=("a", 2, params)),
            threading.Thread(target=engine.rollouts, args=("b", 1, other)),
        ]
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join(timeout=60)
        assert calls[1:] == [1, 1]
        assert engine.model_name == tiny_backend.model_name and engine.tokenizer is tiny_backend.tokenizer
    finally:
        del tiny_backend.generate


def test_the_default_device_is_a_gpu_where_torch_sees_one_else_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from prmloop.models.backends.transformers_backend import default_device

    assert default_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    # No GPU exists in CI: torch's answer is the one thing faked here, to check both branches.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == "cpu"


def test_from_pretrained_without_a_device_loads_onto_the_default_device(
    tiny_backend: TransformersBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prmloop.models.backends.transformers_backend as module

    tiny_backend.model.save_pretrained(str(tmp_path))
    tiny_backend.tokenizer.save_pretrained(str(tmp_path))
    here = TransformersBackend.from_pretrained(str(tmp_path))
    assert here.device.type == module.default_device()
    # Whatever the default names is where the weights go ("meta": a device with no storage, present everywhere).
    monkeypatch.setattr(module, "default_device", lambda: "meta")
    assert TransformersBackend.from_pretrained(str(tmp_path)).device.type == "meta"
    assert TransformersBackend.from_pretrained(str(tmp_path), device="cpu").device.type == "cpu"
