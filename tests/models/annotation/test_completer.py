"""The completer over a real model backend (the tiny random Llama): what the MC estimators receive."""

from __future__ import annotations

import math

from prmloop.models.annotation.completer import GeneratorCompleter, Rollout, math_equivalent
from prmloop.models.annotation.estimate import Sampling
from prmloop.models.annotation.strategies import AdaptiveBinarySearch, SolutionToLabel, annotate
from prmloop.models.backends.base import SamplingParams
from prmloop.models.backends.transformers_backend import TransformersBackend
from prmloop.models.prompts import format_steps, solution_prompt

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
STEPS = ("Tom starts with 3 apples.", "He buys 4 more, so 3 + 4 = 8.")


def test_rollouts_continue_the_state_as_it_was_sampled(tiny_backend: TransformersBackend) -> None:
    completer = GeneratorCompleter(tiny_backend, params=SamplingParams(temperature=1.0, max_new_tokens=12))
    assert completer.prefix(QUESTION, STEPS[:1]) == solution_prompt(tiny_backend, QUESTION, "step_k") + format_steps(
        STEPS[:1], "step_k"
    )
    rollouts = completer.complete(QUESTION, STEPS[:1], 3)
    assert len(rollouts) == 3 and all(isinstance(r, Rollout) for r in rollouts)
    for r in rollouts:
        assert 1 <= r.tokens <= 12 and r.token_logprobs is not None and len(r.token_logprobs) == r.tokens
        assert math.isclose(r.sum_logprob, math.fsum(r.token_logprobs)) and r.sum_logprob < 0
        # A random model rarely stops inside 12 tokens; when it does not, the rollout says so.
        assert r.finish_reason == ("length" if r.tokens == 12 else "stop")


def test_rollouts_are_reproducible_per_state_and_draw(tiny_backend: TransformersBackend) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    a, b = GeneratorCompleter(tiny_backend, params=params), GeneratorCompleter(tiny_backend, params=params)
    first = a.complete(QUESTION, STEPS[:1], 2)
    assert first == b.complete(QUESTION, STEPS[:1], 2)  # same state, same draw: same rollouts
    assert a.complete(QUESTION, STEPS[:1], 2) != first  # the next draw of that state differs
    other_seed = GeneratorCompleter(tiny_backend, params=params, seed=1).complete(QUESTION, STEPS[:1], 2)
    assert other_seed != first


def test_a_random_model_never_reaches_the_answer_and_the_ledger_says_why(tiny_backend: TransformersBackend) -> None:
    completer = GeneratorCompleter(tiny_backend, params=SamplingParams(temperature=1.0, max_new_tokens=6))
    strategy = AdaptiveBinarySearch(sampling=Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2))
    result = annotate(SolutionToLabel(QUESTION, STEPS, "7", False), strategy, [completer], checker=math_equivalent)
    # MC(s_0) = 0: the contribution is undefined, so no step is blamed (status unresolved, no labels).
    assert result.status == "unresolved" and result.first_error_step is None and result.labels == ()
    (s0,) = result.estimates
    assert (s0.step_index, s0.rollouts, s0.correct_rollouts) == (-1, 4, 0)  # grew from 2 to N_max = 4
    assert result.cost.rollouts == 4 and result.cost.generated_tokens > 0
    assert sum(result.cost.failures.values()) == result.cost.rollouts  # all cut by length or unparseable


def test_a_completer_view_continues_each_solution_in_its_own_prompt_format(tiny_backend: TransformersBackend) -> None:
    from prmloop.models.prompts import arith_prompt, stop_strings

    completer = GeneratorCompleter(tiny_backend, params=SamplingParams(temperature=1.0, max_new_tokens=6))
    arith = completer.with_style("step_k_arith")
    assert completer.with_style("step_k") is completer and arith.style == "step_k_arith"
    assert completer.style == "step_k"  # the view does not change the shared completer
    assert arith.prefix(QUESTION, STEPS[:1]) == arith_prompt(QUESTION) + "Step 1: Tom starts with 3 apples.\n"
    calls: list[SamplingParams] = []
    real = tiny_backend.rollouts

    def recording(prefix: str, n: int, params: SamplingParams | None = None) -> list:  # type: ignore[type-arg]
        assert params is not None
        calls.append(params)
        return real(prefix, n, params)

    tiny_backend.rollouts = recording  # type: ignore[method-assign]
    try:
        arith.complete(QUESTION, STEPS[:1], 2)
        completer.complete(QUESTION, STEPS[:1], 2)
    finally:
        del tiny_backend.rollouts
    assert calls[0].stop == stop_strings("step_k_arith") and calls[1].stop == ()
