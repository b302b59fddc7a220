"""The workload ``prmloop bench generate`` gives every engine, and its in-process vLLM runner.

Two workloads, the same for transformers, vLLM in process and the vLLM server:

- *sampling*: ``k`` solutions of each of ``n_prompts`` GSM8K-style questions (the sampler's call);
- *rollouts*: Monte-Carlo rollouts from each successive prefix of one solution (EpicPRM's 2-shot prompt,
  the question and its first ``t`` steps, ``t = 0..S-1``), ``n`` per prefix, one call per prefix, as
  the annotator's binary search makes them: every call shares the prompt, and each prefix extends the
  last, so a prefix cache serves most of each prefill.

This module imports only the standard library and ``prmloop.models`` at its top, so it also runs inside
``.venv-vllm`` (``python -m prmloop.flows.bench.generate_vllm '<json>'`` prints one JSON line), where
the in-process vLLM engine lives.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prmloop.models.backends.base import Completion, Generator, SamplingParams

__all__ = ["Workload", "run_workload"]

QUESTIONS = [
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
STEPS = [
    "Janet's ducks lay 16 eggs and she eats 3, so 16 - 3 = 13 eggs are left.",
    "She bakes muffins with 4 eggs, so 13 - 4 = 9 eggs are left to sell.",
    "She sells each egg for $2, so she makes 9 * 2 = $18.",
    "The answer is 18.",
]


@dataclass(frozen=True)
class Workload:
    """Sizes of both workloads (JSON-able: it crosses into ``.venv-vllm`` as an argument)."""

    n_prompts: int = 8
    k: int = 8
    rollouts: int = 8
    max_new_tokens: int = 96
    temperature: float = 0.7
    seed: int = 0


def _prompts(engine: Any, workload: Workload) -> tuple[list[str], list[str]]:
    from prmloop.models.prompts import continuation_prompt, render_for, solution_messages

    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(workload.n_prompts)]
    sampling = [render_for(engine, solution_messages(q, "step_k")) for q in questions]
    base = render_for(engine, solution_messages(QUESTIONS[0], "step_k"))
    prefixes = [continuation_prompt(base, STEPS[:t], "step_k") for t in range(len(STEPS))]
    return sampling, prefixes


def _timed(run: Callable[[], Sequence[Completion]]) -> dict[str, float]:
    started = time.perf_counter()
    completions = run()
    elapsed = time.perf_counter() - started
    tokens = sum(c.completion_tokens for c in completions)
    return {"tokens": tokens, "seconds": round(elapsed, 2), "tokens_per_s": round(tokens / elapsed, 2)}


def run_workload(engine: Generator, workload: Workload, *, sampling: bool = True) -> dict[str, Any]:
    """Tokens/s of ``engine`` on both workloads (after one short warm-up call)."""
    prompts, prefixes = _prompts(engine, workload)
    params = SamplingParams(
        n=workload.k, max_new_tokens=workload.max_new_tokens, temperature=workload.temperature, seed=workload.seed
    )
    engine.generate(prompts[:1], params.model_copy(update={"n": 1, "max_new_tokens": 4}))
    out: dict[str, Any] = {}
    if sampling:
        out["sampling"] = _timed(lambda: [c for cs in engine.generate(prompts, params) for c in cs])
    rollout_params = params.model_copy(update={"n": workload.rollouts})

    def rollouts() -> list[Completion]:
        done: list[Completion] = []
        for t, prefix in enumerate(prefixes):
            done += engine.rollouts(prefix, workload.rollouts, rollout_params.model_copy(update={"seed": t}))
        return done

    out["rollouts"] = _timed(rollouts)
    encode = getattr(engine, "encode_prompt", None)
    out["rollout_prefix_tokens"] = [len(encode(p)) for p in prefixes] if encode else None
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """In ``.venv-vllm``: load ``vllm.LLM`` on the embedded model (prefix caching as asked) and run the workload."""
    args = json.loads((argv or sys.argv[1:])[0])
    from prmloop.models.backends.vllm_backend import VLLMBackend

    started = time.perf_counter()
    backend = VLLMBackend.from_model("smollm2", enable_prefix_caching=bool(args["prefix_caching"]), max_model_len=4096)
    load_s = time.perf_counter() - started
    try:
        result = run_workload(backend, Workload(**args["workload"]), sampling=bool(args.get("sampling", True)))
    finally:
        backend.unload()
    print(json.dumps({"load_s": round(load_s, 1), **result}), flush=True)


if __name__ == "__main__":
    main()
