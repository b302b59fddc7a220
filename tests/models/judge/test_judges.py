"""The judges over a real model backend: scripted judgments scored by the tiny random Llama (Eq. 5 from
real teacher-forced log-probs), and the raw tiny model whose judgments are unparsed, never guessed."""

from __future__ import annotations

from typing import Any

import pytest

from prmloop.models.backends.transformers_backend import TransformersBackend
from prmloop.models.judge.judges import Critic, StepwiseJudge
from prmloop.models.judge.uncertainty import decision_probability

PROBLEM = "What is 3*4+1?"
STEPS = ("3*4 = 12.", "12 + 1 = 14.", "The answer is 14.")


FINE = 'Correct arithmetic.", "has_error": "no"}'
WRONG = '12 + 1 is 13.", "has_error": "yes"}'


def test_the_judge_stops_at_the_first_error_with_eq5_from_real_scores(
    tiny_backend: TransformersBackend, scripted_judge: Any
) -> None:
    script = {
        STEPS[0]: [FINE, FINE, FINE, "not json"],
        STEPS[1]: [WRONG, WRONG, FINE, WRONG],
        STEPS[2]: [FINE] * 4,
    }
    engine = scripted_judge(tiny_backend, script)
    judgment = StepwiseJudge(engine, samples=3).judge(PROBLEM, STEPS)  # type: ignore[arg-type]
    assert [v.step_index for v in judgment.verdicts] == [0, 1]  # step 2 is never judged
    assert judgment.first_error_step == 1 and judgment.step_labels() == (True, False, None)
    first, second = judgment.verdicts
    assert (first.samples, first.unparsed, second.unparsed) == (3, 1, 0)
    assert first.has_error is False and second.has_error is True
    # Eq. 5 of the prediction, recomputed from the real model's scores of "yes" and "no" after it.
    context = next(c for c, option in engine.scored if option == "yes" and WRONG[:10] in c)
    [yes, no] = tiny_backend.score([(context, "yes"), (context, "no")])
    assert second.p_error == pytest.approx(decision_probability(yes.sum_logprob, no.sum_logprob), abs=1e-5)
    assert second.cot_entropy is not None and second.cot_entropy_discrete == pytest.approx(0.636514, abs=1e-6)
    assert first.cot_entropy_discrete == 0.0 and judgment.unparsed == 1
    every = StepwiseJudge(engine, samples=3, all_steps=True).judge(PROBLEM, STEPS)  # type: ignore[arg-type]
    assert len(every.verdicts) == 3


def test_a_random_model_gives_unparsed_judgments_not_guesses(tiny_backend: TransformersBackend) -> None:
    judgment = StepwiseJudge(tiny_backend, samples=2, max_new_tokens=8).judge(PROBLEM, STEPS[:1])
    [verdict] = judgment.verdicts
    assert judgment.generated_tokens > 0
    if verdict.has_error is None:  # what 8 random tokens give, almost surely
        assert verdict.p_error is None and judgment.step_labels() == (None,)
        assert judgment.failures["unparsed"] >= 1


def test_the_critic_reports_unparsed_for_a_model_that_never_concludes(tiny_backend: TransformersBackend) -> None:
    verdict = Critic(tiny_backend, samples=1, max_new_tokens=8).judge(PROBLEM, STEPS)
    assert verdict.generated_tokens > 0 and verdict.first_error_step == "unparsed" and verdict.unparsed == 1
