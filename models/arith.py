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
a small constant, states a number that no single operation on known numbers gives, or states a final
answer other than the gold one. A step is *verified* if it is not wrong and every number it derives or
states is on the reference chain (a number of the question or a reference intermediate result). Any
other step (true arithmetic that leaves the reference chain: a regrouping such as ``4 + 5 = 9`` before
adding to 3, or a wrong operation) is *unverified*: it may be right or wrong, so an error after it is
not exactly located.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from pydantic import JsonValue

from prmloop.models.grading import extract_answer

__all__ = [
    "DEFAULT_CONSTANTS",
    "FEW_SHOT_EXAMPLES",
    "LEVELS",
    "ArithChain",
    "ArithQuestion",
    "ChainStep",
    "LevelSpec",
    "StepCheck",
    "StepVerdict",
    "check_steps",
    "find_equations",
    "generate_question",
    "generate_questions",
    "level_spec",
    "parse_number",
    "reference_solution",
]

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
questions solved at least once) to 4 %, 2 %, 2 % and 0 %: the embedded model barely solves even level
1, so levels 2-5 are for stronger generators. A prompt with arithmetic worked examples
(:data:`FEW_SHOT_EXAMPLES`) helps at level 1 (see ``flows/evals/arith.py``)."""


FEW_SHOT_EXAMPLES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "Ella has 5 cards. She buys 3 more cards. How many cards does Ella have now?",
        ("Ella has 5 cards and buys 3 more, so 5 + 3 = 8 cards.",),
        "The final answer is: 8",
    ),
    (
        "Max has 4 bags with 3 shells in each bag. He loses 2 shells. How many shells does Max have now?",
        ("The bags hold 4 * 3 = 12 shells.", "He loses 2, so 12 - 2 = 10 shells."),
        "The final answer is: 10",
    ),
)
"""Two worked examples in the curriculum's own style, ``(problem, steps, final-answer sentence)``: one
equation per step, EpicPRM's ``The final answer is:`` ending (appendix A.1). A prompt built from them
(``step_k_arith`` in :mod:`prmloop.flows.evals.arith`) replaces EpicPRM's two MATH examples, whose
LaTeX and geometry a 135M model imitates instead of adding."""


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
        numbers.insert(sum(len(_NUMBER_RE.findall(s)) for s in sentences[:position]), d)
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


# --------------------------------------------------------------------------------------------------
# Reading numbers and equations in free text
# --------------------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d])|\d+(?:\.\d+)?")
_STEP_LABEL_RE = re.compile(r"\bstep\s*\d+\s*[:.)]?", flags=re.IGNORECASE)
_ORDINAL_RE = re.compile(r"\b\d+(?:st|nd|rd|th)\b", flags=re.IGNORECASE)
_LATEX_SUBS = (
    (r"\times", " * "),
    (r"\cdot", " * "),
    (r"\div", " / "),
    (r"\$", " "),
    (r"\(", " "),
    (r"\)", " "),
    (r"\[", " "),
    (r"\]", " "),
    (r"\left", ""),
    (r"\right", ""),
    ("×", " * "),
    ("·", " * "),
    ("∙", " * "),
    ("÷", " / "),
    ("−", " - "),
    ("–", " - "),
    ("$", " "),
    ("**", " "),  # Markdown bold, never a power in these solutions
    ("{", " "),
    ("}", " "),
)
_TOKEN_RE = re.compile(
    r"(?P<num>(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?)"
    r"|(?P<op>[+\-*/])"
    r"|(?P<eq>=)"
    r"|(?P<open>\()"
    r"|(?P<close>\))"
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<space>[ \t]+)"
    r"|(?P<other>.)",
    flags=re.DOTALL,
)


def parse_number(text: str) -> Fraction:
    """``"1,000"`` -> 1000, ``"5.0"`` -> 5, ``"2.5"`` -> 5/2 (exact, no floating point)."""
    return Fraction(text.replace(",", ""))


_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def _normalise(text: str) -> str:
    text = _FRAC_RE.sub(r" ((\1) / (\2)) ", text)
    for old, new in _LATEX_SUBS:
        text = text.replace(old, new)
    text = _STEP_LABEL_RE.sub(" ", text)
    return _ORDINAL_RE.sub(" ", text)


@dataclass(frozen=True, slots=True)
class Equation:
    """An equation found in text: its sides, each a list of tokens (numbers as :class:`Fraction`)."""

    sides: tuple[tuple[str | Fraction, ...], ...]
    text: str

    def values(self) -> list[Fraction | None]:
        """The value of each side (``None``: the side is not a well-formed expression)."""
        return [_evaluate(side) for side in self.sides]

    @property
    def holds(self) -> bool:
        values = self.values()
        return None not in values and len(set(values)) == 1

    def operands(self) -> list[Fraction]:
        """Numbers in sides that compute something (a side with an operator)."""
        return [t for side in self.sides if _has_operator(side) for t in side if isinstance(t, Fraction)]

    def results(self) -> list[Fraction]:
        """The value every side shares, when the equation holds."""
        values = self.values()
        return [values[0]] if self.holds and values[0] is not None else []

    def numbers(self) -> list[Fraction]:
        return [t for side in self.sides for t in side if isinstance(t, Fraction)]


def _has_operator(side: Sequence[str | Fraction]) -> bool:
    """Whether a side computes something: an operator after its first token (a leading ``-`` is a
    sign), or a parenthesis that follows a number or another parenthesis (``2(5)``, ``(2)(5)``)."""
    for previous, token in itertools.pairwise(side):
        if token in ("+", "-", "*", "/"):
            return True
        if token == "(" and (isinstance(previous, Fraction) or previous == ")"):
            return True
    return bool(side) and side[0] in ("*", "/")


def _evaluate(tokens: Sequence[str | Fraction]) -> Fraction | None:
    """Value of an expression of numbers, ``+ - * /`` and parentheses (usual precedence), or ``None``."""
    position = 0

    def peek() -> str | Fraction | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str | Fraction | None:
        nonlocal position
        token = peek()
        position += 1
        return token

    def expression() -> Fraction | None:
        value = term()
        while value is not None and peek() in ("+", "-"):
            op = take()
            right = term()
            if right is None:
                return None
            value = value + right if op == "+" else value - right
        return value

    def term() -> Fraction | None:
        value = factor()
        while value is not None and peek() in ("*", "/", "("):
            # "2(5)" and "(2)(5)" multiply (a juxtaposition of bare numbers does not).
            op = take() if peek() in ("*", "/") else "*"
            right = factor()
            if right is None or (op == "/" and right == 0):
                return None
            value = value * right if op == "*" else value / right
        return value

    def factor() -> Fraction | None:
        token = take()
        if isinstance(token, Fraction):
            return token
        if token == "-":
            inner = factor()
            return None if inner is None else -inner
        if token == "(":
            value = expression()
            return value if take() == ")" else None
        return None

    if not tokens:
        return None
    result = expression()
    return result if position == len(tokens) else None


def _tokens(text: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN_RE.finditer(_normalise(text))]


def _runs(text: str) -> list[list[str | Fraction]]:
    """Maximal runs of arithmetic tokens (numbers as :class:`Fraction`, ``=`` kept as a token).

    A run is broken by anything that is not a number, an operator, ``=``, a parenthesis or
    whitespace, with two exceptions that keep ``3 apples + 4 apples = 7 apples`` and ``3 x 4`` whole:
    one word right after a number is skipped when an operator or ``=`` follows it, and a lone ``x``
    between two numbers is a multiplication sign.
    """
    raw = [(kind, value) for kind, value in _tokens(text) if kind != "space"]
    runs: list[list[str | Fraction]] = []
    current: list[str | Fraction] = []
    for i, (kind, value) in enumerate(raw):
        prev_kind = raw[i - 1][0] if i > 0 else None
        next_kind = raw[i + 1][0] if i + 1 < len(raw) else None
        if kind == "num":
            current.append(parse_number(value))
        elif kind in ("op", "eq", "open", "close"):
            current.append(value)
        elif kind == "word" and value.lower() == "x" and prev_kind == "num" and next_kind == "num":
            current.append("*")
        elif kind == "word" and len(value) > 1 and prev_kind == "num" and next_kind in ("op", "eq") and current:
            # A unit ("3 apples + 4 apples"); a single letter is a variable ("2x + 3 = 7"), not a unit.
            continue
        else:
            if current:
                runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def find_equations(text: str) -> list[Equation]:
    """The equations of ``text`` that compute something: at least two sides, one with an operator.

    ``3 + 4 = 7`` and ``Total = 3 + 4 = 7`` (the word side is dropped) are equations; ``4 more = 7``
    (no operator) and ``3 + 4`` (no ``=``) are not.
    """
    equations: list[Equation] = []
    for tokens in _runs(text):
        sides: list[list[str | Fraction]] = [[]]
        for token in tokens:
            if token == "=":
                sides.append([])
            else:
                sides[-1].append(token)
        # Strip dangling operators and parentheses at the run's ends ("= 7." or "(3 + 4 = 7").
        cleaned = [tuple(_trim(side)) for side in sides]
        cleaned = [side for side in cleaned if side]
        if len(cleaned) >= 2 and any(_has_operator(side) for side in cleaned):
            shown = " = ".join(" ".join(_show(t) for t in side) for side in cleaned)
            equations.append(Equation(sides=tuple(cleaned), text=shown))
    return equations


def _trim(side: list[str | Fraction]) -> list[str | Fraction]:
    while side and side[-1] in ("+", "-", "*", "/", "("):
        side = side[:-1]
    while side and side[0] in ("+", "*", "/", ")"):
        side = side[1:]
    if side.count("(") != side.count(")"):
        side = [t for t in side if t not in ("(", ")")]
    return side


def _show(token: str | Fraction) -> str:
    if isinstance(token, Fraction):
        return str(token.numerator) if token.denominator == 1 else f"{float(token):g}"
    return token


def _stated_numbers(text: str) -> list[Fraction]:
    """Numbers of ``text`` outside its equations (labels, ordinals and the answer sentence removed)."""
    runs_numbers = [n for eq in find_equations(text) for n in eq.numbers()]
    all_numbers = [t for tokens in _runs(text) for t in tokens if isinstance(t, Fraction)]
    remaining = list(all_numbers)
    for n in runs_numbers:
        if n in remaining:
            remaining.remove(n)
    return remaining


def _bare_expression_values(text: str) -> list[Fraction]:
    """Values of expressions written without a result (``he must have 3 + 1 books``): each one is a
    quantity the step asserts, as much as a stated number is."""
    values = []
    for tokens in _runs(text):
        if "=" in tokens:
            continue
        side = _trim(list(tokens))
        value = _evaluate(side) if _has_operator(side) else None
        if value is not None:
            values.append(value)
    return values


_RESULT_CUE_RE = re.compile(
    # a number after a cue word, in the same clause, not the start of an expression ...
    r"\b(?:total|left|now|in all|altogether|remaining|remain)\b[^.,;:!?\n]{0,40}?\$?"
    r"(\d+(?:\.\d+)?)(?![\d.]*\s*[+\-*/x×=])"
    # ... or before one ("2 stickers left", "12 apples in total", "20 books now")
    r"|(\d+(?:\.\d+)?)\s+(?:[a-z]+\s+)?(?:left|remaining|in all|altogether|in total|now)\b",
    flags=re.IGNORECASE,
)


def _result_claims(text: str) -> list[Fraction]:
    """Numbers ``text`` presents as the outcome of something (after "total", "left", "now", ...,
    or before "left" / "in total"), not part of an equation or expression."""
    text = _STEP_LABEL_RE.sub(" ", text)
    return [parse_number(m.group(1) or m.group(2)) for m in _RESULT_CUE_RE.finditer(text)]


_NUMBER_WORDS = {
    word: value
    for value, word in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", flags=re.IGNORECASE)


def _number_words(text: str) -> list[Fraction]:
    """Numbers written as words (``two`` .. ``twenty``): never an error on their own, but unverified."""
    return [Fraction(_NUMBER_WORDS[m.group(1).lower()]) for m in _NUMBER_WORD_RE.finditer(text)]


# --------------------------------------------------------------------------------------------------
# The checker
# --------------------------------------------------------------------------------------------------

StepVerdict = Literal["verified", "wrong", "unverified"]


@dataclass(frozen=True, slots=True)
class StepCheck:
    """The checker's verdict on one solution.

    Attributes:
        status: ``"exact"``: ``first_error_step`` is the first wrong step (every step before it is
            verified), or ``None`` and every step is verified and the stated answer is the gold one;
            ``"unknown"``: the checker cannot decide (see ``reason``).
        first_error_step: 0-based index of the first wrong step; ``None`` when there is none or the
            status is unknown.
        reason: how the verdict was reached, in words.
        verdicts: one per step checked: ``verified``, ``wrong`` or ``unverified``. Checking stops at
            the first wrong step, so this may be shorter than the solution.
        wrong_step: the first step found wrong even when an unverified step before it makes the
            location unknown (a hint, not a label).
        equations: how many equations were read.
    """

    status: Literal["exact", "unknown"]
    first_error_step: int | None
    reason: str
    verdicts: tuple[StepVerdict, ...] = field(default=())
    wrong_step: int | None = None
    equations: int = 0

    @property
    def exact(self) -> bool:
        return self.status == "exact"


def _as_chain(chain: ArithChain | Mapping[str, Any]) -> ArithChain:
    return chain if isinstance(chain, ArithChain) else ArithChain.from_json(chain)


def _single_operation(equation: Equation) -> tuple[str, Fraction, Fraction] | None:
    """``(op, a, b)`` when the equation computes one operation ``a op b`` (``2(5)`` is ``*``)."""
    operands = equation.operands()
    if len(operands) != 2:
        return None
    side = next(side for side in equation.sides if _has_operator(side))
    ops = [t for t in side[1:] if t in ("+", "-", "*", "/")]
    return (str(ops[0]) if ops else "*", operands[0], operands[1])


def _same_operation(single: tuple[str, Fraction, Fraction], step: ChainStep) -> bool:
    """Whether ``a op b`` is the chain step (either order for ``+`` and ``*``)."""
    op, a, b = single
    left, right = Fraction(step.left), Fraction(step.right)
    if op != step.op:
        return False
    return (a, b) == (left, right) or (op in ("+", "*") and (b, a) == (left, right))


def _one_operation(values: Sequence[Fraction]) -> set[Fraction]:
    """Every ``a op b`` for two known numbers at different positions of ``values`` (so ``4 * 4`` only
    when 4 is known twice; constants are left out by the caller: ``x + 1`` would make every
    off-by-one slip look derivable)."""
    out: set[Fraction] = set()
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            if i == j:
                continue
            out.update((a + b, a - b, a * b))
            if b != 0:
                out.add(a / b)
    return out


def _fmt(value: Fraction) -> str:
    return _show(value)


def _final_answer(text: str) -> Fraction | Literal["unparsed"] | None:
    """The final answer a step states as a number, ``None`` if it states none, ``"unparsed"`` if not a number."""
    if not re.search(r"answer|\\boxed|\\fbox|####", text, flags=re.IGNORECASE):
        return None
    answer = extract_answer(text)
    if answer is None:
        return None
    numbers = [t for tokens in _runs(answer) for t in tokens if isinstance(t, Fraction)]
    value = _evaluate([t for tokens in _runs(answer) for t in tokens]) if numbers else None
    if value is None and len(numbers) == 1:
        value = numbers[0]
    return "unparsed" if value is None else value


def check_steps(
    question_chain: ArithChain | Mapping[str, Any],
    steps: Sequence[str],
    *,
    constants: Iterable[int] = DEFAULT_CONSTANTS,
    strictness: Literal["equations", "numbers", "lenient"] = "equations",
) -> StepCheck:
    """Find the first wrong step of a solution to an arithmetic question, exactly, or say "unknown".

    ``question_chain`` is the question's :class:`ArithChain` (or its JSON form, as stored in a
    question's metadata under ``chain``); ``steps`` are the solution's steps as free text, with or
    without ``Step k:`` labels.

    Each step, in order, is:

    - *wrong* if it has a false equation (``3 * 4 = 13``; all sides are evaluated exactly with
      fractions), or an equation that uses a number that is not *known* (known = the question's
      numbers, the results of earlier equations and numbers earlier steps stated, and ``constants``),
      or it states, outside any equation, a number that is not known and that no single operation on
      two known numbers gives (an invented number), or it states a final answer other than the gold
      one (``The final answer is: 8``, ``\\boxed{8}``);
    - *verified* if it is not wrong, every equation with one operation is a step of the reference
      chain (same operation, same operands, either order for ``+`` and ``*``) whose operands are at
      hand, every longer expression reaches a value of the chain, and
      every number it
      states without one is a number of the question, an earlier result, or the result of a
      reference step whose operands are already known (a value stated before it can be had, such as
      the final answer in the first step, or a bare constant such as "0 cookies", is not vouched for);
    - *unverified* otherwise (correct arithmetic that leaves the reference chain: a valid regrouping
      or a wrong operation, which arithmetic alone cannot tell apart; an expression written without
      a result, such as ``3 + 1 books``, counts as deriving its value; so does a number presented as
      an outcome, "the total is 5", "I'll have 2 left", "she now has 4", when it is a question number
      rather than a result).

    Verdict: the first wrong step is the first error, ``status="exact"``, when every step before it is
    verified; if an unverified step comes first, ``status="unknown"`` (``wrong_step`` still says where
    the first provable error is). With no wrong step: ``first_error_step=None`` and ``"exact"`` when
    every step is verified, the gold answer is stated and at least one equation was read;
    ``"unknown"`` otherwise (no equation at all, no answer stated, or an unverified step).

    What the checker does not see, and ``strictness``. It checks quantities, not words, so a sentence
    can be false with every number in it right ("Ella has 30 cards" when Anna has them, "she is 3
    years old" when she is 9). Which steps without an equation it vouches for is therefore a choice:

    - ``"equations"`` (default): only a step with an equation (all of its equations true, operands
      at hand, results on the chain) or one that states the gold answer is verified; restatements
      and prose are unverified. An error is located exactly only after steps that each showed
      correct work, or in the first step.
    - ``"numbers"``: also a step whose stated numbers are all question numbers or results that can
      be had by now; a step with no number at all is unverified.
    - ``"lenient"``: also a step with no number at all ("the first arithmetic error").

    Measured on SmolLM2-135M's step_k solutions to levels 1-5 (240 solutions, 231 not correct; the
    located errors checked by hand, see ``flows/evals/arith.py``): ``"equations"`` located 22, of
    which 21 were the true first error (20 of the 22 are in step 0, where any located error is the
    first); ``"numbers"`` located 46, of which about two in three were right in a hand check (the
    misses: an earlier sentence that misuses question numbers, "Ella has 30 cards" when Anna has
    them); ``"lenient"`` located 91, fewer of them right. Number words (``two``, ``twelve``) are not
    read as numbers; a step with one that is not on the chain is unverified.

    Numbers are read with ``1,000`` -> 1000, ``$5`` -> 5, ``5.0`` -> 5; ``x``, ``×``, ``*``,
    ``\\times``, ``\\cdot`` multiply; ``÷``, ``/`` and ``\\div`` divide; ``Step 3:`` labels and
    ordinals (``2nd``) are not numbers.
    """
    chain = _as_chain(question_chain)
    gold = Fraction(chain.answer)
    allowed = {Fraction(c) for c in constants}
    on_chain = {Fraction(n) for n in chain.numbers} | {Fraction(r) for r in chain.results} | allowed
    question_numbers = {Fraction(n) for n in chain.numbers}
    known = question_numbers | allowed
    verdicts: list[StepVerdict] = []
    first_unverified: int | None = None
    equation_count = 0
    answer_stated = False

    for index, step in enumerate(steps):
        equations = find_equations(step)
        equation_count += len(equations)
        wrong: str | None = None
        derived: list[Fraction] = []
        unreadable = False
        off_chain: list[Fraction] = []
        for equation in equations:
            if None in equation.values():
                # A side that is not a well-formed expression ("10 2 * 39"): read wrongly, so no verdict.
                unreadable = True
                continue
            if not equation.holds:
                values = ", ".join("?" if v is None else _fmt(v) for v in equation.values())
                wrong = f"step {index}: false equation {equation.text} (sides evaluate to {values})"
                break
            unknown = [n for n in equation.operands() if n not in known and n not in derived]
            if unknown:
                wrong = (
                    f"step {index}: {equation.text} uses {_fmt(unknown[0])}, "
                    "which is neither in the question nor derived"
                )
                break
            # One operation must be a step of the reference chain whose operands are at hand
            # ("3 * 3 = 9" is not, when 9 is the answer of 3 * 4 - 3); a longer expression may
            # reach any value of the chain ("3 + 4 + 5 = 12").
            have = known | set(derived)
            at_hand = [c for c in chain.steps if {Fraction(c.left), Fraction(c.right)} <= have]
            single = _single_operation(equation)
            vouched = (
                any(_same_operation(single, c) for c in at_hand)
                if single is not None
                else all(r in on_chain for r in equation.results())
            )
            if not vouched:
                off_chain.extend(equation.results())
            derived.extend(equation.results())
        answer = _final_answer(step)
        stated = [] if answer is not None else _stated_numbers(step)
        if wrong is None and answer is not None and answer != "unparsed":
            answer_stated = True
            if answer != gold:
                wrong = f"step {index}: states the final answer {_fmt(answer)}, but the answer is {_fmt(gold)}"
        # A number stated without an equation is vouched for only if it could be had by now: a
        # question number, an earlier result, or the next result of the reference chain.
        so_far = known | set(derived)
        next_results = {Fraction(c.result) for c in chain.steps if {Fraction(c.left), Fraction(c.right)} <= so_far}
        if wrong is None:
            pool = [Fraction(n) for n in chain.numbers] + [k for k in so_far if k not in question_numbers | allowed]
            reachable = _one_operation(pool) | next_results
            for number in stated:
                if number not in known and number not in derived and number not in reachable:
                    wrong = f"step {index}: states {_fmt(number)}, which no operation on known numbers gives"
                    break
        if wrong is not None:
            verdicts.append("wrong")
            if first_unverified is None:
                return StepCheck("exact", index, wrong, tuple(verdicts), index, equation_count)
            return StepCheck(
                "unknown",
                None,
                f"{wrong}; but step {first_unverified} before it could not be verified",
                tuple(verdicts),
                index,
                equation_count,
            )
        stateable = ((known - allowed) | question_numbers | set(derived) | next_results) - (allowed - question_numbers)
        fresh = off_chain + [n for n in _bare_expression_values(step) if n not in on_chain]
        words = [n for n in _number_words(step) if n not in allowed]  # "one of them" claims nothing
        fresh += [n for n in (*stated, *words) if n not in stateable]
        # "The total is 5", "I'll have 2 left", "she now has 4": a count claimed as a result must be a
        # result (of the chain or of this solution's equations), not a restated question number.
        results = {Fraction(r) for r in chain.results} | (known - question_numbers - allowed) | set(derived)
        fresh += [n for n in _result_claims(step) if n not in results and answer is None]
        prose_only = not equations and not stated and answer is None
        unchecked = {
            "lenient": False,
            "numbers": prose_only,
            # Only an equation, or the gold answer, vouches for a step: restatements do not.
            "equations": not equations and answer is None,
        }[strictness]
        if fresh or unreadable or unchecked:
            verdicts.append("unverified")
            if first_unverified is None:
                first_unverified = index
        else:
            verdicts.append("verified")
        known.update(derived)
        known.update(stated)

    if not steps:
        return StepCheck("unknown", None, "no steps to check", (), None, 0)
    if equation_count == 0:
        return StepCheck("unknown", None, "no equation in any step: nothing to verify", tuple(verdicts), None, 0)
    if first_unverified is not None:
        return StepCheck(
            "unknown",
            None,
            f"no provably wrong step, but step {first_unverified} leaves the reference chain",
            tuple(verdicts),
            None,
            equation_count,
        )
    if not answer_stated:
        return StepCheck(
            "unknown", None, "every step verified, but no final answer is stated", tuple(verdicts), None, equation_count
        )
    return StepCheck(
        "exact", None, "every step verified and the gold answer stated", tuple(verdicts), None, equation_count
    )
