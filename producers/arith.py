"""Generated arithmetic questions as :class:`~prmloop.models.questions.Question` records (dataset ``arith``).

A thin wrapper over :mod:`prmloop.models.arith`: the generator and the exact step checker live there
(pure computation, shared by whoever needs them); this module only names the questions and packs
what the checker needs into ``metadata`` so it travels with the question through the loop
(``QuestionRegistered`` carries the metadata; ``SolutionSampled`` carries the question):

- ``level`` and ``seed``: how to regenerate the question;
- ``chain``: :meth:`~prmloop.models.arith.ArithChain.to_json` (the question's numbers, the reference
  steps ``left op right = result`` and the answer), read back by
  :func:`~prmloop.models.arith.check_steps`;
- ``reference_steps``: the generator's own solution, one equation per step;
- ``source``: ``"arith L<level>"``.

Ids are :func:`~prmloop.models.arith.arith_question_id` (``arith/L<level>/<seed>/<index>``): the
question is a function of these three values, so the same id always names the same question
(re-registering it is idempotent downstream).
"""

from __future__ import annotations

from pydantic import JsonValue

from prmloop.models.arith import ARITH_DATASET, ArithQuestion, arith_question_id, generate_questions, level_spec
from prmloop.models.questions import Question

__all__ = ["arith_question", "arith_questions"]


def arith_question(generated: ArithQuestion) -> Question:
    """The :class:`Question` record of one generated question."""
    metadata: dict[str, JsonValue] = {
        "level": generated.level,
        "seed": generated.seed,
        "index": generated.index,
        "chain": generated.chain.to_json(),
        "reference_steps": list(generated.reference_steps),
        "source": f"arith L{generated.level}",
    }
    return Question(
        id=arith_question_id(generated.level, generated.seed, generated.index),
        dataset=ARITH_DATASET,
        problem=generated.problem,
        gold_answer=str(generated.answer),
        metadata=metadata,
    )


def arith_questions(n: int, *, level: int | str, seed: int = 0) -> list[Question]:
    """``n`` questions of ``level`` (1..5, ``"3"`` or ``"L3"``) under ``seed``, deterministic.

    Question ``i`` does not depend on ``n``: asking for more questions extends the list.

    Raises:
        ValueError: unknown level or negative ``n``.
    """
    spec = level_spec(level)
    return [arith_question(generated) for generated in generate_questions(n, spec, seed)]
