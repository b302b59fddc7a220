"""A completer with known ground truth, so the annotation algorithms are measured exactly without a model.

Each simulated incorrect solution has ``T`` steps and a ground-truth first error ``e`` (0-based). The
chance that a rollout from the state through ``m`` steps reaches the gold answer is::

    p(m) = p_start + (1 - p_start) * progress_gain * m / T    while the error is not included (m <= e)
    p(m) = p_after_error                                      once it is (m > e): self-correction only

``p_start`` (the question's difficulty, MC(s_0)) is drawn per solution, and the error position is tied
to it as EpicPRM Fig. 2 observed (hard questions go wrong early) by ``difficulty_position_link``.

Per-step uncertainty: Δu of every step is N(0, 1); with probability ``uncertainty_correlation`` the
error step's Δu is lifted above all others, so UnPRM's descending-Δu order tries the error first with
probability ``ρ + (1 - ρ) / T`` (roughly).

Rollouts: length ``(T - m) * tokens_per_step * LogNormal(0, 0.3) + answer_tokens`` (wrong rollouts 20%
longer); longer than ``max_tokens`` means ``finish_reason="length"`` and no answer. The mean token
negative log-likelihood of a rollout is ``N(nll_correct or nll_incorrect, nll_sd)``, so the PPL
weighting of MC-PPL has something to weigh. Everything is seeded: the same seed gives the same
solutions, and the same sequence of calls gives the same rollouts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.models.annotation.completer import Rollout
from prmloop.models.annotation.strategies import SolutionToLabel

__all__ = [
    "SIMULATOR_NAME",
    "SimulatedCompleter",
    "SimulatedCompleterError",
    "SimulatedSolution",
    "SimulatedStepUncertainty",
    "SimulatorConfig",
    "SimulatorOptions",
    "simulate_solutions",
]


#: The simulator's name as a backend and as a model, wherever it stands in for one.
SIMULATOR_NAME = "simulator"


class SimulatedCompleterError(RuntimeError):
    """An injected engine failure (``SimulatorConfig.p_completer_error``)."""


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """Knobs of the simulated world (defaults: ~10-step solutions, papers' regime of rollout lengths)."""

    min_steps: int = 7
    max_steps: int = 13
    p_start_range: tuple[float, float] = (0.1, 0.9)
    progress_gain: float = 0.3
    p_after_error: float = 0.02
    uncertainty_correlation: float = 0.7
    difficulty_position_link: float = 0.6
    tokens_per_step: int = 40
    answer_tokens: int = 12
    max_tokens: int = 1024
    nll_correct: float = 0.35
    nll_incorrect: float = 0.55
    nll_sd: float = 0.1
    p_unparseable: float = 0.01
    p_completer_error: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        for name in ("progress_gain", "p_after_error", "uncertainty_correlation", "difficulty_position_link"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")


@dataclass(frozen=True, slots=True)
class SimulatedSolution:
    """One incorrect solution with its ground truth."""

    question: str
    gold_answer: str
    steps: tuple[str, ...]
    first_error_step: int
    p_start: float
    progress_gain: float
    p_after_error: float
    uncertainty_delta: tuple[float, ...]

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def success_probability(self, n_included: int) -> float:
        """Chance a rollout from the state through ``n_included`` steps reaches the gold answer."""
        if n_included > self.first_error_step:
            return self.p_after_error
        return self.p_start + (1.0 - self.p_start) * self.progress_gain * n_included / self.n_steps

    def to_label(self) -> SolutionToLabel:
        return SolutionToLabel(self.question, self.steps, self.gold_answer, False, self.uncertainty_delta)


def simulate_solutions(n: int, config: SimulatorConfig | None = None, seed: int = 0) -> list[SimulatedSolution]:
    """``n`` incorrect solutions drawn from ``config`` (deterministic in ``seed``)."""
    config = config or SimulatorConfig()
    rng = random.Random(f"prmloop-simulator|{seed}")
    lo, hi = config.p_start_range
    out = []
    for i in range(n):
        n_steps = rng.randint(config.min_steps, config.max_steps)
        p_start = rng.uniform(lo, hi)
        link = config.difficulty_position_link
        ratio = link * (p_start - lo) / max(hi - lo, 1e-9) + (1.0 - link) * rng.random() + rng.gauss(0.0, 0.1)
        first_error = min(n_steps - 1, max(0, int(ratio * n_steps)))
        deltas = [rng.gauss(0.0, 1.0) for _ in range(n_steps)]
        # Both draws are always made, so solutions differ across correlations only in their Δu.
        lifted, lift = rng.random() < config.uncertainty_correlation, abs(rng.gauss(0.0, 0.5)) + 1e-6
        if lifted:
            others = [d for t, d in enumerate(deltas) if t != first_error]
            deltas[first_error] = max(others, default=0.0) + lift
        out.append(
            SimulatedSolution(
                question=f"simulated question {seed}-{i}",
                gold_answer=str(1000 + i),
                steps=tuple(f"step {t + 1} of simulated solution {i}" for t in range(n_steps)),
                first_error_step=first_error,
                p_start=p_start,
                progress_gain=config.progress_gain,
                p_after_error=config.p_after_error,
                uncertainty_delta=tuple(deltas),
            )
        )
    return out


@dataclass
class SimulatedCompleter:
    """Implements :class:`prmloop.models.annotation.completer.Completer` over simulated solutions."""

    solutions: Sequence[SimulatedSolution]
    config: SimulatorConfig = field(default_factory=SimulatorConfig)
    seed: int = 0
    name: str = SIMULATOR_NAME
    #: Seconds each call sleeps: stands in for an engine's time per batched request, so services built on
    #: the simulator (the annotator under faults, its scaling benchmark) behave like ones waiting on a GPU.
    latency_s: float = 0.0
    calls: int = 0
    _by_question: dict[str, SimulatedSolution] = field(init=False, repr=False)
    _draws: dict[tuple[str, int], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_question = {s.question: s for s in self.solutions}
        self._draws = {}

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        try:
            solution = self._by_question[question]
        except KeyError:
            raise KeyError(
                f"the simulator knows no question {question[:60]!r}; build it from the same solutions"
            ) from None
        m = len(steps)
        if m > solution.n_steps:
            raise ValueError(f"a prefix of {m} steps is longer than the {solution.n_steps}-step solution")
        draw = self._draws.get((question, m), 0)
        self._draws[(question, m)] = draw + 1
        self.calls += 1
        rng = random.Random(f"{self.seed}|{question}|{m}|{draw}")
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        if rng.random() < self.config.p_completer_error:
            raise SimulatedCompleterError(f"injected engine failure on {question!r} after {m} steps")
        return [self._rollout(rng, solution, m) for _ in range(n)]

    def _rollout(self, rng: random.Random, solution: SimulatedSolution, m: int) -> Rollout:
        cfg = self.config
        correct = rng.random() < solution.success_probability(m)
        length = (solution.n_steps - m) * cfg.tokens_per_step * rng.lognormvariate(0.0, 0.3)
        tokens = int(length * (1.0 if correct else 1.2)) + cfg.answer_tokens
        nll = max(0.01, rng.gauss(cfg.nll_correct if correct else cfg.nll_incorrect, cfg.nll_sd))
        if tokens > cfg.max_tokens:
            return Rollout(None, cfg.max_tokens, -nll * cfg.max_tokens, "length")
        if rng.random() < cfg.p_unparseable:
            return Rollout(None, tokens, -nll * tokens, "stop")
        answer = solution.gold_answer if correct else str(int(solution.gold_answer) + 1 + rng.randrange(5))
        return Rollout(answer, tokens, -nll * tokens, "stop")


class SimulatorOptions(BaseSettings):
    """The options that name one simulated world; ``prmloop simulate``, ``score --simulator`` and
    ``annotate --completer simulator`` must be given the same ones to agree on it."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore")

    sim_n: int = Field(default=100, ge=1, description="simulator: the world's size (as given to `prmloop simulate`)")
    sim_seed: int = Field(default=0, description="simulator: the world's seed")
    correlation: float = Field(
        default=0.7, ge=0.0, le=1.0, description="simulator: how strongly step uncertainty marks the first error"
    )

    def world(self) -> tuple[SimulatorConfig, list[SimulatedSolution]]:
        config = SimulatorConfig(uncertainty_correlation=self.correlation)
        return config, simulate_solutions(self.sim_n, config, seed=self.sim_seed)


class SimulatedStepUncertainty:
    """The step uncertainty ``u(s_t)`` of simulated solutions, by problem text (as the completer keys them).

    ``u(s_t)`` is the running sum of the world's Δu with ``u(s_0) = 0``, so the deltas a scorer takes
    of it are the world's own, with their configured correlation to the first error.
    """

    def __init__(self, solutions: Sequence[SimulatedSolution]) -> None:
        self._by_question = {s.question: s for s in solutions}

    def __call__(self, problem: str) -> tuple[float, ...] | None:
        solution = self._by_question.get(problem)
        if solution is None:
            return None
        total, out = 0.0, []
        for delta in solution.uncertainty_delta:
            total += delta
            out.append(total)
        return tuple(out)
