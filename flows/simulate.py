"""``prmloop simulate``: publish simulated incorrect solutions, so the annotator can run without a model.

Each simulated solution (:func:`prmloop.models.simulator.simulate_solutions`) becomes three events: the
question (``QuestionRegistered``, whose problem text is what the simulated completer keys on), the
solution (``SolutionSampled``, graded incorrect, with the gold answer) and its per-step uncertainty
(``StepsScored`` with the simulator's Δu, which carries the configured correlation with the first
error). ``prmloop annotate --completer simulator`` with the same ``--n``/``--seed``/``--correlation``
rebuilds the same world and labels them; the simulator's ground truth then scores the labels.
Event ids are deterministic, so publishing the same world twice stores nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

from prmloop.models.simulator import SimulatedSolution
from prmloop.producers.uncertainty import rank_steps_by_delta
from prmloop.store.events import (
    Envelope,
    ModelRef,
    QuestionRegistered,
    SamplingSpec,
    SolutionSampled,
    StepsScored,
    deterministic_event_id,
    make_event,
)

__all__ = ["PRODUCER", "SIMULATOR_REF", "simulated_events", "simulated_question_id", "simulated_solution_id"]

PRODUCER = "prmloop.simulate/1"
SIMULATOR_REF = ModelRef(backend="simulator", name="simulator")


def simulated_question_id(seed: int, index: int) -> str:
    return f"sim/{seed}/{index}"


def simulated_solution_id(seed: int, index: int) -> str:
    return f"sim/{seed}/{index}/0"


def simulated_events(solutions: Sequence[SimulatedSolution], seed: int) -> list[Envelope]:
    """Question, solution and step-score events of ``solutions`` (deterministic ids)."""
    out: list[Envelope] = []
    for i, solution in enumerate(solutions):
        qid, sid = simulated_question_id(seed, i), simulated_solution_id(seed, i)
        question = QuestionRegistered(
            question_id=qid,
            dataset="simulated",
            problem=solution.question,
            gold_answer=solution.gold_answer,
            source=f"simulator seed {seed} #{i}",
            metadata={"first_error_step": solution.first_error_step, "p_start": round(solution.p_start, 6)},
        )
        sampled = SolutionSampled(
            solution_id=sid,
            question_id=qid,
            generator=SIMULATOR_REF,
            sampling=SamplingSpec(),
            prompt_format="step_k",
            text="\n".join(solution.steps),
            steps=solution.steps,
            final_answer=str(int(solution.gold_answer) + 1),
            correct=False,
            gold_answer=solution.gold_answer,
        )
        deltas = solution.uncertainty_delta
        scored = StepsScored(
            solution_id=sid,
            question_id=qid,
            scorer=SIMULATOR_REF,
            step_uncertainty=tuple(float(x) for x in _cumulative(deltas)),
            uncertainty_delta=deltas,
            step_order=rank_steps_by_delta(deltas, include_first=True),
        )
        for payload, key in ((question, qid), (sampled, sid), (scored, sid)):
            event_id = deterministic_event_id(payload.event_type, "simulated", key)
            out.append(make_event(payload, producer=PRODUCER, event_id=event_id))
    return out


def _cumulative(deltas: Sequence[float]) -> list[float]:
    """u(s_t) from Δu with u(s_0) = 0 (the inverse of :func:`~prmloop.producers.uncertainty.uncertainty_deltas`)."""
    total, out = 0.0, []
    for d in deltas:
        total += d
        out.append(total)
    return out
