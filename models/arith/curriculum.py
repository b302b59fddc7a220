"""The arithmetic curriculum's questions: levels, seeded word problems and their reference chains.

See :mod:`prmloop.models.arith` for why the curriculum exists.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from pydantic import JsonValue

#: The integers of a generated sentence (the curriculum writes whole numbers only).
_INTEGER_RE = re.compile(r"\d+")

Op = Literal["+", "-", "*", "/"]
EventKind = Literal["add", "sub", "add_groups", "share"]

DEFAULT_CONSTANTS: frozenset[int] = frozenset({0, 1})
"""Numbers a solution may use without deriving them (``x - 1``, ``x * 1``); the question's numbers and
earlier results are always allowed. Kept small on purpose: every allowed constant is a number the
checker can no longer catch as invented."""


# --------------------------------------------------------------------------------------------------
# Levels
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LevelSpec:
    """One difficulty setting of the generator.

    Attributes:
        level: 1 (easiest) upwards.
        description: one line for reports.
        events: how many events change the running total after the opening sentence.
        operations: which events may occur: ``add`` (buys ``b`` more), ``sub`` (gives ``b`` away),
            ``add_groups`` (buys ``b`` bags of ``c``: two steps), ``share`` (shares equally among
            ``b`` friends: the last event only).
        max_number: upper bound of the numbers written in the question (start, ``b``).
        max_factor: upper bound of bag counts, bag sizes and the number of friends.
        start_groups: whether the story opens with ``a`` bags of ``c`` (a multiplication step).
        distractors: sentences with numbers the answer does not need.
    """

    level: int
    description: str
    events: int
    operations: tuple[EventKind, ...]
    max_number: int
    max_factor: int = 5
    start_groups: bool = False
    distractors: int = 0


LEVELS: dict[int, LevelSpec] = {
    1: LevelSpec(1, "1 step: add two numbers from 1 to 5", events=1, operations=("add",), max_number=5),
    2: LevelSpec(2, "1 step: add or subtract, numbers up to 10", events=1, operations=("add", "sub"), max_number=10),
    3: LevelSpec(3, "2 steps: add and subtract, numbers up to 20", events=2, operations=("add", "sub"), max_number=20),
    4: LevelSpec(
        4,
        "2 steps: bags of items (a product), then add or subtract; numbers up to 20",
        events=1,
        operations=("add", "sub"),
        max_number=20,
        max_factor=5,
        start_groups=True,
    ),
    5: LevelSpec(
        5,
        "3-5 steps: products, sums, differences and an equal share; one distractor; numbers up to 50",
        events=3,
        operations=("add", "sub", "add_groups", "share"),
        max_number=50,
        max_factor=6,
        distractors=1,
    ),
}
"""The curriculum. Measured with SmolLM2-135M-Instruct on EpicPRM's step_k prompt (12 questions x 4
samples per level, temperature 0.7, 160 new tokens), accuracy falls from 10 % (level 1; 5 of 12
questions solved at least once) to 4 %, 2 %, 2 % and 0 %. With the curriculum's own worked examples as
plain text (the ``step_k_arith`` prompt, :func:`prmloop.models.prompts.arith_prompt`) the same model
solves far more (docs/sampling.md's table has the figures)."""


def level_spec(level: int | str | LevelSpec) -> LevelSpec:
    """The :class:`LevelSpec` for ``level`` (``3``, ``"3"``, ``"L3"`` or a spec itself)."""
    if isinstance(level, LevelSpec):
        return level
    text = str(level).strip().upper().removeprefix("L")
    try:
        return LEVELS[int(text)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown arithmetic level {level!r}; choose one of {sorted(LEVELS)}") from None


# --------------------------------------------------------------------------------------------------
# Chains and questions
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainStep:
    """One operation of the reference solution: ``left op right = result`` (integers)."""

    op: Op
    left: int
    right: int
    result: int

    def __post_init__(self) -> None:
        if Fraction(self.result) != _apply(self.op, Fraction(self.left), Fraction(self.right)):
            raise ValueError(f"chain step {self.left} {self.op} {self.right} = {self.result} is false")

    def to_json(self) -> dict[str, JsonValue]:
        return {"op": self.op, "left": self.left, "right": self.right, "result": self.result}


@dataclass(frozen=True, slots=True)
class ArithChain:
    """What the checker needs to know about a question: its numbers and its reference chain.

    Attributes:
        numbers: every number written in the question, in order (distractors included).
        steps: the reference solution's operations; the last result is the answer.
        distractors: the numbers of the question the answer does not need.
    """

    numbers: tuple[int, ...]
    steps: tuple[ChainStep, ...]
    distractors: tuple[int, ...] = ()

    @property
    def answer(self) -> int:
        return self.steps[-1].result

    @property
    def results(self) -> tuple[int, ...]:
        return tuple(step.result for step in self.steps)

    def to_json(self) -> dict[str, JsonValue]:
        """JSON-able form (what a :class:`~prmloop.models.questions.Question`'s metadata carries)."""
        return {
            "numbers": list(self.numbers),
            "steps": [step.to_json() for step in self.steps],
            "distractors": list(self.distractors),
            "answer": self.answer,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArithChain:
        """Inverse of :meth:`to_json` (the ``answer`` key, if present, must agree with the chain)."""
        steps = tuple(
            ChainStep(op=s["op"], left=int(s["left"]), right=int(s["right"]), result=int(s["result"]))
            for s in data["steps"]
        )
        if not steps:
            raise ValueError("an arithmetic chain needs at least one step")
        chain = cls(
            numbers=tuple(int(n) for n in data["numbers"]),
            steps=steps,
            distractors=tuple(int(n) for n in data.get("distractors", ())),
        )
        if "answer" in data and int(data["answer"]) != chain.answer:
            raise ValueError(f"chain answer {data['answer']} differs from its last result {chain.answer}")
        return chain


#: The dataset name of curriculum questions.
ARITH_DATASET = "arith"

#: Ids of curriculum questions, ``arith/L<level>/<seed>/<index>`` (:func:`arith_question_id`): the
#: question is a function of these three values, so an id always names the same question.
ARITH_ID = re.compile(rf"^{ARITH_DATASET}/L(?P<level>[1-9])/(?P<seed>-?\d+)/(?P<index>\d+)$")


def arith_question_id(level: int, seed: int, index: int) -> str:
    """``arith/L<level>/<seed>/<index>``, the id :data:`ARITH_ID` reads back."""
    return f"{ARITH_DATASET}/L{level}/{seed}/{index}"


@dataclass(frozen=True, slots=True)
class ArithQuestion:
    """A generated question: text, answer, chain and where it came from."""

    problem: str
    answer: int
    chain: ArithChain
    level: int
    seed: int
    index: int
    reference_steps: tuple[str, ...]


_PEOPLE: tuple[tuple[str, str, str], ...] = (
    ("Tom", "he", "his"),
    ("Anna", "she", "her"),
    ("Sam", "he", "his"),
    ("Lily", "she", "her"),
    ("Ben", "he", "his"),
    ("Mia", "she", "her"),
    ("Leo", "he", "his"),
    ("Emma", "she", "her"),
)
_FRIENDS: tuple[str, ...] = ("Max", "Zoe", "Jack", "Ella", "Noah", "Ruby")
_ITEMS: tuple[str, ...] = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells")


def _apply(op: str, left: Fraction, right: Fraction) -> Fraction:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        raise ZeroDivisionError("division by zero")
    return left / right


def _count(n: int, items: str) -> str:
    """``"1 apple"``, ``"3 apples"`` (every item name here is a plural in ``-s``)."""
    return f"{n} {items[:-1]}" if n == 1 else f"{n} {items}"


def generate_question(level: int | str | LevelSpec, seed: int = 0, index: int = 0) -> ArithQuestion:
    """Question ``index`` of ``level`` under ``seed``: the same three arguments give the same question.

    The story keeps one running total of one kind of item; each event is one sentence and one or two
    chain steps. Totals stay positive (a subtraction is drawn only when the total is at least 2 and
    takes less than all), and a share is drawn only when some divisor in ``2..max_factor`` divides
    the total exactly, so every intermediate result is a positive integer.
    """
    spec = level_spec(level)
    rng = random.Random(f"prmloop-arith/{spec.level}/{seed}/{index}")
    name, he, his = rng.choice(_PEOPLE)
    cap = he.capitalize()
    items = rng.choice(_ITEMS)
    friend = rng.choice(_FRIENDS)
    sentences: list[str] = []
    numbers: list[int] = []
    steps: list[ChainStep] = []
    reference: list[str] = []
    question = f"How many {items} does {name} have now?"

    if spec.start_groups:
        bags, size = rng.randint(2, spec.max_factor), rng.randint(2, spec.max_factor)
        total = bags * size
        sentences.append(f"{name} has {bags} bags with {size} {items} in each bag.")
        numbers += [bags, size]
        steps.append(ChainStep("*", bags, size, total))
        reference.append(f"{name} has {bags} bags of {size} {items}, so {bags} * {size} = {total} {items}.")
    else:
        total = rng.randint(min(2, spec.max_number), spec.max_number)
        sentences.append(f"{name} has {_count(total, items)}.")
        numbers.append(total)

    for position in range(spec.events):
        last = position == spec.events - 1
        divisors = [d for d in range(2, spec.max_factor + 1) if total % d == 0]
        allowed = [
            kind
            for kind in spec.operations
            if (kind != "share" or (last and divisors)) and (kind != "sub" or total >= 2)
        ]
        kind = rng.choice(allowed or ["add"])
        if kind == "share":
            d = rng.choice(divisors)
            sentences.append(f"Then {he} shares all {his} {items} equally among {d} friends.")
            numbers.append(d)
            steps.append(ChainStep("/", total, d, total // d))
            reference.append(f"Each of the {d} friends gets {total} / {d} = {total // d} {items}.")
            total //= d
            question = f"How many {items} does each friend get?"
        elif kind == "sub":
            b = rng.randint(1, total - 1)
            verb = rng.choice(
                (f"gives {_count(b, items)} to {friend}", f"loses {_count(b, items)}", f"sells {_count(b, items)}")
            )
            sentences.append(f"{cap} {verb}.")
            numbers.append(b)
            steps.append(ChainStep("-", total, b, total - b))
            reference.append(f"{cap} no longer has {b} of them, so {total} - {b} = {total - b} {items}.")
            total -= b
        elif kind == "add_groups":
            bags, size = rng.randint(2, spec.max_factor), rng.randint(2, spec.max_factor)
            sentences.append(f"Then {he} buys {bags} bags with {size} {items} in each bag.")
            numbers += [bags, size]
            steps.append(ChainStep("*", bags, size, bags * size))
            reference.append(f"The bags hold {bags} * {size} = {bags * size} {items}.")
            steps.append(ChainStep("+", total, bags * size, total + bags * size))
            reference.append(f"So {he} has {total} + {bags * size} = {total + bags * size} {items}.")
            total += bags * size
        else:
            b = rng.randint(1, spec.max_number)
            verb = rng.choice(("buys", "finds", "gets"))
            sentences.append(f"{cap} {verb} {_count(b, 'more ' + items)}.")
            numbers.append(b)
            steps.append(ChainStep("+", total, b, total + b))
            reference.append(f"{cap} {verb} {b} more, so {total} + {b} = {total + b} {items}.")
            total += b

    distractor_numbers: list[int] = []
    for _ in range(spec.distractors):
        used = set(numbers) | {s.result for s in steps}
        d = rng.choice([n for n in range(2, spec.max_number + 1) if n not in used] or [spec.max_number + 1])
        other = rng.choice([i for i in _ITEMS if i != items])
        sentence = rng.choice((f"{friend} has {d} {other}.", f"{name} is {d} years old."))
        position = rng.randint(1, len(sentences))
        # The question's numbers are listed in the order the question states them.
        numbers.insert(sum(len(_INTEGER_RE.findall(s)) for s in sentences[:position]), d)
        sentences.insert(position, sentence)
        distractor_numbers.append(d)

    reference.append(f"The final answer is: {total}")
    chain = ArithChain(numbers=tuple(numbers), steps=tuple(steps), distractors=tuple(distractor_numbers))
    return ArithQuestion(
        problem=" ".join([*sentences, question]),
        answer=total,
        chain=chain,
        level=spec.level,
        seed=seed,
        index=index,
        reference_steps=tuple(reference),
    )


def generate_questions(n: int, level: int | str | LevelSpec, seed: int = 0) -> list[ArithQuestion]:
    """Questions ``0..n-1`` of ``level`` under ``seed`` (each one independent of ``n``)."""
    if n < 0:
        raise ValueError(f"n must be at least 0, got {n}")
    return [generate_question(level, seed, index) for index in range(n)]


def reference_solution(question: ArithQuestion) -> list[str]:
    """The generator's own step-by-step solution: one equation per chain step, then the answer."""
    return list(question.reference_steps)
