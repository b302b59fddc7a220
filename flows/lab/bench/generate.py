"""Generation benchmark: the backend wrapper against the raw engine call, and batched rollouts.

``bench_generate`` runs, in one process and on the same prompts:

1. *raw*: ``model.generate`` called directly with the same inputs and sampling settings (no
   log-probability recording, no result records);
2. *wrapper*: :meth:`TransformersBackend.generate`, which also records every sampled token's
   log-probability and builds :class:`Completion` records;
3. *rollouts*: ``n`` continuations of one prefix (EpicPRM's 2-shot prompt, a question and its first
   step: what the Monte-Carlo annotator continues) as one batched call (:meth:`rollouts`, prefix
   prefilled once), as one batched call that prefills every copy, and as ``n`` calls of one each.

Raw and wrapper runs alternate and the best of ``repeats`` is kept, which damps noise from other
processes on a shared CPU. Token counts are the generated tokens up to and including
end-of-sequence, counted the same way for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prmloop.models.backends.base import Completion, SamplingParams

if TYPE_CHECKING:
    from prmloop.models.backends.transformers_backend import TransformersBackend

__all__ = ["bench_generate"]

_QUESTIONS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four. "
    "She sells the rest for $2 each. How much does she make every day?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
    "Josh buys a house for $80,000 and puts in $50,000 in repairs. This increased the value of the house "
    "by 150%. How much profit did he make?",
    "James runs 3 sprints 3 times a week. He runs 60 meters each sprint. How many total meters does he run a week?",
    "Every day, Wendi feeds each of her 20 chickens three cups of feed. How many cups does she need a week?",
    "Kylar wants to buy 16 glasses. One glass costs $5, but every second glass costs only 60% of the price. "
    "How much does he pay?",
    "Toulouse has twice as many sheep as Charleston. Charleston has 4 times as many sheep as Seattle. "
    "Seattle has 20 sheep. How many sheep do they have together?",
    "Carla is downloading a 200 GB file at 2 GB/minute. How many minutes does the download take?",
]


def _tokens_until_eos(rows: list[list[int]], eos: frozenset[int]) -> int:
    total = 0
    for row in rows:
        for i, token in enumerate(row):
            if token in eos:
                total += i + 1
                break
        else:
            total += len(row)
    return total


def bench_generate(
    quick: bool,
    *,
    backend: TransformersBackend | None = None,
    model: str = "smollm2",
    n_prompts: int | None = None,
    max_new_tokens: int | None = None,
    n_rollouts: int | None = None,
    repeats: int | None = None,
    temperature: float = 0.7,
    threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Tokens/s of the raw engine call and of the wrapper, and the batched-rollout speedup.

    Args:
        quick: small sizes (4 prompts x 32 tokens, 4 rollouts x 32 tokens, 1 repeat) for CI.
        backend: an already loaded transformers backend (default: load ``model``).
        model: what to load when ``backend`` is not given (``"smollm2"`` = the embedded GGUF).
        n_prompts, max_new_tokens, n_rollouts, repeats: override the sizes (full: 8, 128, 8, 3).
        temperature: sampling temperature for every run (top-p 1).
        threads: ``torch.set_num_threads`` for the run (process-wide); ``None`` keeps torch's choice.
            On a CPU shared with other processes, 1 avoids oversubscription.
        seed: seed of every run, so raw and wrapper sample the same tokens.

    Returns:
        A JSON-able dict with at least ``raw_tokens_per_s``, ``wrapper_tokens_per_s``,
        ``wrapper_to_raw_ratio`` and ``batched_rollout_speedup``.
    """
    import torch

    from prmloop.models.backends.transformers_backend import TransformersBackend
    from prmloop.models.prompts import continuation_prompt, render_chat, solution_messages

    if threads is not None:
        torch.set_num_threads(threads)
    n_prompts = n_prompts or (4 if quick else 8)
    max_new_tokens = max_new_tokens or (32 if quick else 128)
    n_rollouts = n_rollouts or (4 if quick else 8)
    repeats = repeats or (1 if quick else 3)

    load_s = 0.0
    if backend is None:
        started = time.perf_counter()
        backend = TransformersBackend.from_pretrained(model)
        load_s = time.perf_counter() - started

    questions = [_QUESTIONS[i % len(_QUESTIONS)] for i in range(n_prompts)]
    prompts = [render_chat(backend.tokenizer, solution_messages(q, "double_newline")) for q in questions]
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    inputs = backend.generation_inputs(prompts)
    width = inputs["input_ids"].shape[1]
    eos = frozenset(backend.generation_kwargs(params, 1, width)["generation_config"].eos_token_id)

    # The raw engine call: plain generate() keywords, the same sampling distribution (top_k=0 turns
    # off transformers' global top-k default), no log-probability recording, no records.
    raw_kwargs: dict[str, Any] = {
        "do_sample": True,
        "temperature": temperature,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": max_new_tokens,
        "pad_token_id": backend.tokenizer.pad_token_id,
        "eos_token_id": sorted(eos),
    }

    def raw_run() -> tuple[int, float]:
        torch.manual_seed(seed)
        started = time.perf_counter()
        with torch.inference_mode():
            sequences = backend.model.generate(**inputs, **raw_kwargs)
        elapsed = time.perf_counter() - started
        return _tokens_until_eos(sequences[:, width:].tolist(), eos), elapsed

    def wrapper_run() -> tuple[int, float]:
        started = time.perf_counter()
        results = backend.generate(prompts, params)
        elapsed = time.perf_counter() - started
        return sum(c.completion_tokens for completions in results for c in completions), elapsed

    raw_best = wrapper_best = 0.0
    raw_tokens = wrapper_tokens = 0
    for _ in range(repeats):
        tokens, elapsed = raw_run()
        if tokens / elapsed > raw_best:
            raw_best, raw_tokens = tokens / elapsed, tokens
        tokens, elapsed = wrapper_run()
        if tokens / elapsed > wrapper_best:
            wrapper_best, wrapper_tokens = tokens / elapsed, tokens

    # A Monte-Carlo rollout prefix as the annotator builds it: EpicPRM's 2-shot prompt + one step.
    prefix = continuation_prompt(
        render_chat(backend.tokenizer, solution_messages(_QUESTIONS[0], "step_k")),
        ["16 - 3 - 4 = 9 eggs are left to sell."],
        "step_k",
    )
    rollout_params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)

    def rollout_tps(run: Callable[[], list[Completion]]) -> float:
        started = time.perf_counter()
        completions = run()
        return sum(c.completion_tokens for c in completions) / (time.perf_counter() - started)

    def sequential() -> list[Completion]:
        return [
            backend.rollouts(prefix, 1, rollout_params.model_copy(update={"seed": seed + i}))[0]
            for i in range(n_rollouts)
        ]

    def batched_copying() -> list[Completion]:
        backend.share_prefix = False
        try:
            return backend.rollouts(prefix, n_rollouts, rollout_params)
        finally:
            backend.share_prefix = True

    batched_best = sequential_best = copying_best = 0.0
    for _ in range(repeats):
        batched_best = max(batched_best, rollout_tps(lambda: backend.rollouts(prefix, n_rollouts, rollout_params)))
        copying_best = max(copying_best, rollout_tps(batched_copying))
        sequential_best = max(sequential_best, rollout_tps(sequential))

    return {
        "bench": "generate",
        "quick": quick,
        "model": backend.model_name,
        "device": str(backend.device),
        "torch_threads": torch.get_num_threads(),
        "load_s": round(load_s, 2),
        "n_prompts": n_prompts,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "repeats": repeats,
        "raw_tokens": raw_tokens,
        "wrapper_tokens": wrapper_tokens,
        "raw_tokens_per_s": round(raw_best, 2),
        "wrapper_tokens_per_s": round(wrapper_best, 2),
        "wrapper_to_raw_ratio": round(wrapper_best / raw_best, 3) if raw_best else None,
        "n_rollouts": n_rollouts,
        "rollout_prefix_tokens": len(backend.encode_prompt(prefix)),
        "batched_rollout_tokens_per_s": round(batched_best, 2),
        "batched_rollout_without_prefix_sharing_tokens_per_s": round(copying_best, 2),
        "sequential_rollout_tokens_per_s": round(sequential_best, 2),
        "batched_rollout_speedup": round(batched_best / sequential_best, 3) if sequential_best else None,
    }
