"""Which of a question's ``k`` sampled solutions become PRM training candidates.

Every strategy sees the same pool and keeps at most ``m`` correct and ``n`` incorrect solutions (the
papers use ``k = 32, m = 2, n = 6``). Solutions without a parseable final answer (or that could not be
graded) are dropped first, and the number dropped is reported in :class:`Selection`.

- ``uncertainty`` (UnPRM Sec. 3, "Uncertainty-driven PRM Data Generation"): "Among all correct
  solutions, we select the top m with the highest uncertainty scores, and similarly, among incorrect
  solutions, we select the top n most uncertain."
- ``epicprm`` (EpicPRM Sec. 4, data construction): "For each question, we selected 2 correct and 6
  incorrect solutions exhibiting the lowest cosine similarity scores." The paper does not say which
  vectors or against what; here a solution's score is its mean cosine similarity to the *other*
  solutions of its group (correct or incorrect), over bag-of-words token-count vectors (lower-cased
  words, numbers and single symbols; no embedding model), and the lowest scores are kept.
- ``random``: a seeded uniform sample of each group, the control.

Ties are broken by the solution's position in the pool, so every strategy is deterministic.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "SELECTION_STRATEGIES",
    "Candidate",
    "EpicPRMCosineSelection",
    "RandomSelection",
    "Selection",
    "SelectionStrategy",
    "UncertaintySelection",
    "bag_of_words",
    "cosine_similarity",
    "get_strategy",
    "mean_pairwise_similarity",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One sampled solution as selection sees it.

    Attributes:
        index: position in the question's pool (sample index); selections refer to it.
        text: the solution text (used by the cosine baseline).
        final_answer: the extracted final answer; ``None`` if the solution states none.
        correct: the grade against the gold answer; ``None`` if it could not be graded.
        uncertainty: UnPRM's ``u`` of the solution (:func:`prmloop.models.uncertainty.sequence_entropy`).
    """

    index: int
    text: str
    final_answer: str | None
    correct: bool | None
    uncertainty: float


@dataclass(frozen=True, slots=True)
class Selection:
    """What a strategy kept from one pool.

    Attributes:
        strategy: the strategy's name (recorded as ``SolutionSampled.selected_by``).
        correct: indices of the kept correct solutions, in the order they were chosen.
        incorrect: indices of the kept incorrect solutions, in the order they were chosen.
        dropped: indices of solutions left out for lacking a parseable answer or a grade.
    """

    strategy: str
    correct: tuple[int, ...]
    incorrect: tuple[int, ...]
    dropped: tuple[int, ...]

    @property
    def selected(self) -> tuple[int, ...]:
        return self.correct + self.incorrect


class SelectionStrategy(Protocol):
    """Keeps at most ``m`` correct and ``n`` incorrect candidates of one question's pool."""

    name: str

    def select(self, candidates: Sequence[Candidate], *, m: int, n: int, seed: int | None = None) -> Selection:
        """The kept candidates; ``seed`` makes randomised strategies reproducible."""
        ...


def _partition(candidates: Sequence[Candidate]) -> tuple[list[Candidate], list[Candidate], tuple[int, ...]]:
    correct: list[Candidate] = []
    incorrect: list[Candidate] = []
    dropped: list[int] = []
    for c in candidates:
        if c.final_answer is None or not c.final_answer.strip() or c.correct is None:
            dropped.append(c.index)
        elif c.correct:
            correct.append(c)
        else:
            incorrect.append(c)
    return correct, incorrect, tuple(dropped)


def _check_sizes(m: int, n: int) -> None:
    if m < 0 or n < 0:
        raise ValueError(f"m and n count solutions to keep and must be >= 0, got m={m}, n={n}")


class UncertaintySelection:
    """UnPRM: the ``m`` most uncertain correct and the ``n`` most uncertain incorrect solutions."""

    name = "uncertainty"

    def select(self, candidates: Sequence[Candidate], *, m: int, n: int, seed: int | None = None) -> Selection:
        _check_sizes(m, n)
        correct, incorrect, dropped = _partition(candidates)

        def top(group: list[Candidate], size: int) -> tuple[int, ...]:
            ranked = sorted(group, key=lambda c: (-c.uncertainty, c.index))
            return tuple(c.index for c in ranked[:size])

        return Selection(self.name, top(correct, m), top(incorrect, n), dropped)


_WORD_RE = re.compile(r"[a-z]+|\d+(?:\.\d+)?|[^\sa-z\d]")


def bag_of_words(text: str) -> Counter[str]:
    """Token counts of ``text``: lower-cased words, numbers (``3.5`` is one token) and single symbols."""
    return Counter(_WORD_RE.findall(text.lower()))


def cosine_similarity(a: Counter[str], b: Counter[str]) -> float:
    """``cos(a, b) = a.b / (|a| |b|)`` of two count vectors; 0 if either is empty."""
    norm = math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values()))
    if norm == 0:
        return 0.0
    return sum(count * b[token] for token, count in a.items()) / norm


def mean_pairwise_similarity(texts: Sequence[str]) -> list[float]:
    """For each text, its mean :func:`cosine_similarity` to every other text (0 for a lone text)."""
    vectors = [bag_of_words(t) for t in texts]
    out = []
    for i, v in enumerate(vectors):
        others = [cosine_similarity(v, w) for j, w in enumerate(vectors) if j != i]
        out.append(sum(others) / len(others) if others else 0.0)
    return out


class EpicPRMCosineSelection:
    """EpicPRM's baseline: the solutions least similar to the rest of their group (lowest mean cosine)."""

    name = "epicprm"

    def select(self, candidates: Sequence[Candidate], *, m: int, n: int, seed: int | None = None) -> Selection:
        _check_sizes(m, n)
        correct, incorrect, dropped = _partition(candidates)

        def least_similar(group: list[Candidate], size: int) -> tuple[int, ...]:
            scores = mean_pairwise_similarity([c.text for c in group])
            ranked = sorted(zip(scores, group, strict=True), key=lambda sc: (sc[0], sc[1].index))
            return tuple(c.index for _, c in ranked[:size])

        return Selection(self.name, least_similar(correct, m), least_similar(incorrect, n), dropped)


class RandomSelection:
    """A uniform sample of ``m`` correct and ``n`` incorrect solutions (seeded; the control)."""

    name = "random"

    def select(self, candidates: Sequence[Candidate], *, m: int, n: int, seed: int | None = None) -> Selection:
        _check_sizes(m, n)
        correct, incorrect, dropped = _partition(candidates)
        rng = random.Random(seed)

        def sample(group: list[Candidate], size: int) -> tuple[int, ...]:
            return tuple(c.index for c in rng.sample(group, min(size, len(group))))

        return Selection(self.name, sample(correct, m), sample(incorrect, n), dropped)


SELECTION_STRATEGIES: dict[str, SelectionStrategy] = {
    s.name: s for s in (UncertaintySelection(), EpicPRMCosineSelection(), RandomSelection())
}
"""Strategies by name: ``uncertainty`` (UnPRM, the default), ``epicprm`` (cosine baseline), ``random``."""


def get_strategy(name: str) -> SelectionStrategy:
    """The registered strategy called ``name``."""
    try:
        return SELECTION_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown selection strategy {name!r}; choose one of {sorted(SELECTION_STRATEGIES)}") from None
