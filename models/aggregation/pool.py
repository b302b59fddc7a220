"""A Best-of-N pool as arrays: answer clusters, correctness and PRM step scores of N candidates for
each of Q questions, plus the score rules that turn step scores into one score per candidate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from prmloop.models.aggregation.methods import NO_ANSWER, BoolArray, FloatArray, IntArray, as_answers

ScoreRule = Literal["min", "product", "last"]
SCORE_RULES: tuple[ScoreRule, ...] = get_args(ScoreRule)

ScoreKind = Literal["probability", "reward"]
"""``probability``: step scores are the PRM's probabilities in [0, 1]. ``reward``: scores on an
arbitrary scale (reward models such as internlm2); rules that read probabilities need a transform."""


@dataclass(frozen=True)
class CandidatePool:
    """N candidates for each of Q questions, all arrays indexed ``[question, candidate, ...]``.

    Attributes:
        question_ids: ``Q`` question ids (``problem_id`` of the pool file).
        answers: ``[Q, N]`` int answer-cluster ids, numbered per question by first appearance
            (``0`` is the first candidate's answer); ``-1`` for a candidate without an answer.
        correct: ``[Q, N]`` bool, the candidate's answer is right (graded per cluster).
        step_scores: ``[Q, N, S]`` float PRM step scores, NaN-padded after ``n_steps``.
        n_steps: ``[Q, N]`` int number of scored steps (at least 1 for answered candidates).
        generator: the model that sampled the candidates.
        prm_name: the reward model that scored the steps.
        dataset: benchmark name (``gsm8k``, ``math500``).
        score_kind: whether step scores are probabilities (see :data:`ScoreKind`).
    """

    question_ids: tuple[str, ...]
    answers: IntArray
    correct: BoolArray
    step_scores: FloatArray
    n_steps: IntArray
    generator: str = "unknown"
    prm_name: str = "unknown"
    dataset: str = "unknown"
    score_kind: ScoreKind = "probability"

    def __post_init__(self) -> None:
        ans = as_answers(self.answers)
        q, n = ans.shape
        if len(self.question_ids) != q:
            raise ValueError(f"{len(self.question_ids)} question ids for {q} rows of answers")
        if self.correct.shape != (q, n):
            raise ValueError(f"correct has shape {self.correct.shape}, expected {(q, n)}")
        if self.step_scores.ndim != 3 or self.step_scores.shape[:2] != (q, n):
            raise ValueError(f"step_scores has shape {self.step_scores.shape}, expected ({q}, {n}, steps)")
        if self.n_steps.shape != (q, n):
            raise ValueError(f"n_steps has shape {self.n_steps.shape}, expected {(q, n)}")
        unscored = (ans != NO_ANSWER) & (self.n_steps < 1)
        if unscored.any():
            qi, ci = np.argwhere(unscored)[0]
            raise ValueError(
                f"{int(unscored.sum())} answered candidates have no step scores (first: question "
                f"{self.question_ids[qi]!r}, candidate {ci}); score every candidate with the PRM first"
            )
        if self.score_kind not in get_args(ScoreKind):
            raise ValueError(f"score_kind must be one of {get_args(ScoreKind)}, got {self.score_kind!r}")

    @property
    def n_questions(self) -> int:
        return int(self.answers.shape[0])

    @property
    def n_candidates(self) -> int:
        return int(self.answers.shape[1])

    def scores(self, rule: ScoreRule) -> FloatArray:
        """Per-candidate scores under ``rule`` (see :func:`candidate_scores`)."""
        return candidate_scores(self.step_scores, self.n_steps, rule, self.score_kind)

    def take(self, rows: npt.ArrayLike) -> CandidatePool:
        """The pool restricted to question rows ``rows`` (e.g. a calibration or test split)."""
        idx = np.asarray(rows, dtype=np.int64)
        return CandidatePool(
            question_ids=tuple(self.question_ids[i] for i in idx),
            answers=self.answers[idx],
            correct=self.correct[idx],
            step_scores=self.step_scores[idx],
            n_steps=self.n_steps[idx],
            generator=self.generator,
            prm_name=self.prm_name,
            dataset=self.dataset,
            score_kind=self.score_kind,
        )


def candidate_scores(
    step_scores: FloatArray, n_steps: IntArray, rule: ScoreRule, score_kind: ScoreKind = "probability"
) -> FloatArray:
    """Reduce step scores ``[Q, N, S]`` to one score per candidate ``[Q, N]``.

    ``min``: ``r_i = min R(s_i)`` (UnPRM Algorithms 2-3, line 9 / 4); ``product``: ``prod_t p_t``, the
    probability that every step is right if steps were independent (needs probabilities);
    ``last``: the last step's score. Candidates without steps get NaN.
    """
    if rule not in SCORE_RULES:
        raise ValueError(f"unknown score rule {rule!r}; choose one of {SCORE_RULES}")
    has = n_steps >= 1
    if rule == "min":
        filled = np.where(np.isnan(step_scores), np.inf, step_scores)
        out = filled.min(axis=2)
    elif rule == "product":
        if score_kind != "probability":
            raise ValueError(
                "the product score rule multiplies step probabilities; these step scores are "
                f"{score_kind!r} scores, not probabilities: use score rule 'min' or 'last'"
            )
        out = np.where(np.isnan(step_scores), 1.0, step_scores).prod(axis=2)
    else:
        last = np.clip(n_steps - 1, 0, None)[:, :, None]
        out = np.take_along_axis(step_scores, last, axis=2)[:, :, 0]
    return np.where(has, out, np.nan)


def subsample_indices(n_questions: int, n_candidates: int, n: int, repeats: int, rng: np.random.Generator) -> IntArray:
    """``repeats`` random subsets of ``n`` of the ``n_candidates`` per question, without replacement,
    each kept in the candidates' original order; shape ``[repeats, Q, n]``."""
    if not 1 <= n <= n_candidates:
        raise ValueError(f"subsample size must be in [1, {n_candidates}], got {n}")
    if n == n_candidates:
        return np.broadcast_to(np.arange(n), (repeats, n_questions, n)).copy()
    keys = rng.random((repeats, n_questions, n_candidates))
    chosen = np.argpartition(keys, n - 1, axis=2)[:, :, :n]
    return np.sort(chosen, axis=2).astype(np.int64)


def gather(values: npt.NDArray[np.generic], idx: IntArray) -> npt.NDArray[np.generic]:
    """Stack subsamples ``idx`` (``[R, Q, n]``) of per-candidate ``values`` (``[Q, N]``) into rows
    ``[R * Q, n]`` (row ``r * Q + q`` is subsample ``r`` of question ``q``)."""
    r, q, n = idx.shape
    tiled = np.broadcast_to(values[None], (r, *values.shape))
    return np.take_along_axis(tiled, idx, axis=2).reshape(r * q, n)


@dataclass(frozen=True)
class ScoredCandidates:
    """What a selection rule sees: answer clusters, one score per candidate for each score rule, and
    (for the bounds and for measuring accuracy only) the ground truth. Rows are questions or
    subsamples of questions."""

    answers: IntArray
    scores: dict[ScoreRule, FloatArray]
    score_kind: ScoreKind
    correct: BoolArray | None = None

    @classmethod
    def from_pool(cls, pool: CandidatePool) -> ScoredCandidates:
        """Scores under every rule the pool's score kind allows (``product`` needs probabilities)."""
        rules = [r for r in SCORE_RULES if r != "product" or pool.score_kind == "probability"]
        return cls(
            answers=pool.answers,
            scores={r: pool.scores(r) for r in rules},
            score_kind=pool.score_kind,
            correct=pool.correct,
        )

    def rule_scores(self, rule: ScoreRule) -> FloatArray:
        if rule not in self.scores:
            raise ValueError(
                f"no {rule!r} scores for these candidates (available: {sorted(self.scores)}); "
                "the product rule needs probability scores"
            )
        return self.scores[rule]

    def subsample(self, idx: IntArray) -> ScoredCandidates:
        """Rows ``r * Q + q`` = subsample ``r`` (``idx[r, q]``, from :func:`subsample_indices`) of
        question ``q``."""
        return ScoredCandidates(
            answers=gather(self.answers, idx).astype(np.int64),
            scores={r: gather(s, idx).astype(np.float64) for r, s in self.scores.items()},
            score_kind=self.score_kind,
            correct=None if self.correct is None else gather(self.correct, idx).astype(bool),
        )

    def selection_correct(self, selected: IntArray) -> BoolArray:
        """Whether each row's selected cluster is a correct answer (``-1`` is never correct)."""
        if self.correct is None:
            raise ValueError("these candidates carry no ground truth; load the pool with correctness")
        hit = (self.answers == selected[:, None]) & self.correct
        return hit.any(axis=1) & (selected != NO_ANSWER)
