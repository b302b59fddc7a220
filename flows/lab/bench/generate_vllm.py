"""The workload ``prmloop bench generate`` gives every engine, and its in-process vLLM runner.

Two workloads, the same for transformers, vLLM in process and the vLLM server:

- *sampling*: ``k`` solutions of each of ``n_prompts`` questions of the arithmetic curriculum
  (level 3, its 4-example plain prompt, about 330 tokens: what the loop runs on the embedded model);
- *rollouts*: Monte-Carlo rollouts from each successive prefix of one solution (the prompt, then its
  first ``t`` reference steps), ``n`` per prefix, one call per prefix, as the annotator's binary search
  makes them: every call shares the prompt and each prefix extends the last, so a prefix cache serves
  most of each prefill.

This module imports only the standard library and ``prmloop.models`` at its top, so it also runs inside
``.venv-vllm`` (``python -m prmloop.flows.lab.bench.generate_vllm '<json>'`` prints one JSON line), where
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

ROLLOUT_STEPS = 4
"""Prefixes of the rollout workload: the question alone, then its first 1..3 reference steps."""


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
    """The arithmetic curriculum's prompts (level 3), as the loop runs the embedded model."""
    from prmloop.models.arith import generate_questions, reference_solution
    from prmloop.models.prompts import continuation_prompt, solution_prompt

    questions = generate_questions(workload.n_prompts, 3, seed=workload.seed)
    sampling = [solution_prompt(engine, q.problem, "step_k_arith") for q in questions]
    first = questions[0]
    steps = (reference_solution(first) * ROLLOUT_STEPS)[: ROLLOUT_STEPS - 1]
    base = solution_prompt(engine, first.problem, "step_k_arith")
    prefixes = [continuation_prompt(base, steps[:t], "step_k_arith") for t in range(ROLLOUT_STEPS)]
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
