"""A verifiable arithmetic curriculum: generated word problems with known chains and an exact step checker.

Why. On a laptop the loop runs on SmolLM2-135M-Instruct, which solves about 1 in 160 GSM8K
questions, so Monte-Carlo annotation (EpicPRM Sec. 3.1, the ``MC`` estimate; Qwen "Lessons", Sec. 2)
finds no state from which a rollout reaches the gold answer and labels nothing. This module gives the
loop questions that the embedded model sometimes solves, in levels of increasing difficulty, and, for
every question, the machine-checkable chain of intermediate results. With that chain a sampled
solution's first wrong step can often be located *exactly*, without rollouts: the ground truth that
ProcessBench provides by human annotation ("the earliest step that contains an error"), here computed.

Two parts, both pure (no I/O, no model):

- :func:`generate_question` / :func:`generate_questions`: a seeded story about one person and one kind
  of item, built from events that change a running total (buys more, gives away, buys bags of ``c``,
  shares equally), optionally with distractor sentences whose numbers are not needed. The difficulty
  knob is a :class:`LevelSpec` (number of events, size of numbers, operations, distractors);
  :data:`LEVELS` defines levels 1..5. Every value is an integer (division only where it is exact).
- :func:`check_steps`: reads a solution's steps as free text, finds the equations (``3 + 4 = 7``,
  ``$3 \\times 4 = \\$12``, ``3 apples * 4 = 12 apples``) and the numbers stated outside equations,
  and returns the first step that is provably wrong, when every step before it is provably right
  (:class:`StepCheck`, status ``"exact"``), or ``"unknown"`` with the reason when it cannot decide.

What "provably" means here (see :func:`check_steps` for the rules; the checker reads quantities, not
words, so a step that states no number is neutral by default): a step is *wrong* if it contains a
false equation, uses in an equation a number that is neither in the question, nor derived before, nor
a small constant, writes an operation no correct solution writes (:mod:`~prmloop.models.arith.signs`),
gives a question number a role the question gives another (:mod:`~prmloop.models.arith.roles`),
states a number that no single operation on known numbers gives, or states a final answer other than
the gold one. A step is *verified* if it is not wrong and every number it derives or
states is on the reference chain (a number of the question or a reference intermediate result). Any
other step (true arithmetic that leaves the reference chain: a regrouping such as ``4 + 5 = 9`` before
adding to 3, or a wrong operation) is *unverified*: it may be right or wrong, so an error after it is
not exactly located.
"""

from prmloop.models.arith.checker import StepCheck, StepVerdict, check_steps
from prmloop.models.arith.curriculum import (
    ARITH_DATASET,
    ARITH_ID,
    DEFAULT_CONSTANTS,
    LEVELS,
    ArithChain,
    ArithQuestion,
    ChainStep,
    LevelSpec,
    arith_question_id,
    generate_question,
    generate_questions,
    level_spec,
    reference_solution,
)
from prmloop.models.arith.equations import find_equations, parse_number

__all__ = [
    "ARITH_DATASET",
    "ARITH_ID",
    "DEFAULT_CONSTANTS",
    "LEVELS",
    "ArithChain",
    "ArithQuestion",
    "ChainStep",
    "LevelSpec",
    "StepCheck",
    "StepVerdict",
    "arith_question_id",
    "check_steps",
    "find_equations",
    "generate_question",
    "generate_questions",
    "level_spec",
    "parse_number",
    "reference_solution",
]
