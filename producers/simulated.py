"""``prmloop simulate``: publish simulated incorrect solutions, so the annotator can run without a model.

Each simulated solution (:func:`prmloop.models.simulator.simulate_solutions`) becomes two events: the
question (``QuestionRegistered``, whose problem text is what the simulated completer keys on), the
solution (``SolutionSampled``, graded incorrect, with the gold answer). The step scorer gives them
the simulator's Δu (``prmloop score --simulator``, which carries the configured correlation with the
first error) and ``prmloop annotate --completer simulator``, both with the same
``--sim-n``/``--sim-seed``/``--correlation``, rebuild the same world; its ground truth scores the labels.
Event ids are deterministic, so publishing the same world twice stores nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

from prmloop.models.questions import Question
from prmloop.models.simulator import SIMULATOR_NAME, SimulatedSolution
from prmloop.producers.events import question_registered, solution_sampled
from prmloop.store.events import Envelope, ModelRef

__all__ = ["PRODUCER", "SIMULATOR_REF", "simulated_events", "simulated_question_id", "simulated_solution_id"]

PRODUCER = "prmloop.simulate/1"
SIMULATOR_REF = ModelRef(backend=SIMULATOR_NAME, name=SIMULATOR_NAME)


def simulated_question_id(seed: int, index: int) -> str:
    return f"sim/{seed}/{index}"


def simulated_solution_id(seed: int, index: int) -> str:
    return f"sim/{seed}/{index}/0"


def simulated_events(solutions: Sequence[SimulatedSolution], seed: int) -> list[Envelope]:
    """Question and solution events of ``solutions`` (deterministic ids)."""
    out: list[Envelope] = []
    for i, solution in enumerate(solutions):
        qid, sid = simulated_question_id(seed, i), simulated_solution_id(seed, i)
        question = Question(
            id=qid,
            dataset="simulated",
            problem=solution.question,
            gold_answer=solution.gold_answer,
            metadata={
                "source": f"simulator seed {seed} #{i}",
                "first_error_step": solution.first_error_step,
                "p_start": round(solution.p_start, 6),
            },
        )
        out.append(question_registered(question, producer=PRODUCER))
        out.append(
            solution_sampled(
                question,
                solution_id=sid,
                generator=SIMULATOR_REF,
                prompt_format="step_k",
                text="\n".join(solution.steps),
                steps=solution.steps,
                final_answer=str(int(solution.gold_answer) + 1),
                correct=False,
                identity=("simulated", sid),
                producer=PRODUCER,
            )
        )
    return out
