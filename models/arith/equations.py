"""Reading arithmetic in free text: numbers, equations and the quantities a step states."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from prmloop.models.arith.limits import MAX_EXPRESSION_TERMS, MAX_NESTING, BeyondLimits, check_value

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
        return [evaluate(side) for side in self.sides]

    @property
    def holds(self) -> bool:
        values = self.values()
        return None not in values and len(set(values)) == 1

    def operands(self) -> list[Fraction]:
        """Numbers in sides that compute something (a side with an operator); a number after a sign
        (``-2 + 7``, ``3 * -2``) is negative."""
        found = []
        for side in self.sides:
            if not has_operator(side):
                continue
            for i, token in enumerate(side):
                if isinstance(token, Fraction):
                    signed = i >= 1 and side[i - 1] == "-" and (i == 1 or side[i - 2] in ("+", "-", "*", "/", "("))
                    found.append(-token if signed else token)
        return found

    def results(self) -> list[Fraction]:
        """The value every side shares, when the equation holds."""
        values = self.values()
        return [values[0]] if self.holds and values[0] is not None else []

    def numbers(self) -> list[Fraction]:
        return [t for side in self.sides for t in side if isinstance(t, Fraction)]


def has_operator(side: Sequence[str | Fraction]) -> bool:
    """Whether a side computes something: an operator after its first token (a leading ``-`` is a
    sign), or a parenthesis that follows a number or another parenthesis (``2(5)``, ``(2)(5)``)."""
    for previous, token in itertools.pairwise(side):
        if token in ("+", "-", "*", "/"):
            return True
        if token == "(" and (isinstance(previous, Fraction) or previous == ")"):
            return True
    return bool(side) and side[0] in ("*", "/")


def evaluate(tokens: Sequence[str | Fraction]) -> Fraction | None:
    """Value of an expression of numbers, ``+ - * /`` and parentheses (usual precedence), or ``None``.

    Raises:
        BeyondLimits: parentheses or signs nested more than :data:`~prmloop.models.arith.limits.MAX_NESTING`
            deep, or a value too long to compute with (see :mod:`prmloop.models.arith.limits`).
    """
    position = 0
    depth = 0

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
            value = check_value(value + right if op == "+" else value - right)
        return value

    def term() -> Fraction | None:
        value = factor()
        while value is not None and peek() in ("*", "/", "("):
            # "2(5)" and "(2)(5)" multiply (a juxtaposition of bare numbers does not).
            op = take() if peek() in ("*", "/") else "*"
            right = factor()
            if right is None or (op == "/" and right == 0):
                return None
            value = check_value(value * right if op == "*" else value / right)
        return value

    def factor() -> Fraction | None:
        nonlocal depth
        token = take()
        if isinstance(token, Fraction):
            return token
        if token not in ("-", "("):
            return None
        # Each level is a recursive call: bounded, so that "((((...))))" cannot exhaust the stack.
        depth += 1
        if depth > MAX_NESTING:
            raise BeyondLimits(f"parentheses or signs nested more than {MAX_NESTING} deep (limit MAX_NESTING)")
        try:
            if token == "-":
                inner = factor()
                return None if inner is None else -inner
            value = expression()
            return value if take() == ")" else None
        finally:
            depth -= 1

    if not tokens:
        return None
    result = expression()
    return result if position == len(tokens) else None


def _tokens(text: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN_RE.finditer(_normalise(text))]


def runs(text: str) -> list[list[str | Fraction]]:
    """Maximal runs of arithmetic tokens (numbers as :class:`Fraction`, ``=`` kept as a token).

    A run is broken by anything that is not a number, an operator, ``=``, a parenthesis or
    whitespace, with two exceptions that keep ``3 apples + 4 apples = 7 apples`` and ``3 x 4`` whole:
    one word right after a number is skipped when an operator or ``=`` follows it, and a lone ``x``
    between two numbers is a multiplication sign.

    Raises:
        BeyondLimits: a run of more than :data:`~prmloop.models.arith.limits.MAX_EXPRESSION_TERMS` tokens.
    """
    raw = [(kind, value) for kind, value in _tokens(text) if kind != "space"]
    return [[token for _, token in run] for run in _indexed_runs(raw)]


def _indexed_runs(raw: Sequence[tuple[str, str]]) -> list[list[tuple[int, str | Fraction]]]:
    """:func:`runs` with each token's index in ``raw`` (the non-space tokens)."""
    found: list[list[tuple[int, str | Fraction]]] = []
    current: list[tuple[int, str | Fraction]] = []
    for i, (kind, value) in enumerate(raw):
        prev_kind = raw[i - 1][0] if i > 0 else None
        next_kind = raw[i + 1][0] if i + 1 < len(raw) else None
        if kind == "num":
            current.append((i, parse_number(value)))
        elif kind in ("op", "eq", "open", "close"):
            current.append((i, value))
        elif kind == "word" and value.lower() == "x" and prev_kind == "num" and next_kind == "num":
            current.append((i, "*"))
        elif kind == "word" and len(value) > 1 and prev_kind == "num" and next_kind in ("op", "eq") and current:
            # A unit ("3 apples + 4 apples"); a single letter is a variable ("2x + 3 = 7"), not a unit.
            continue
        else:
            if current:
                found.append(current)
            current = []
    if current:
        found.append(current)
    longest = max((len(run) for run in found), default=0)
    if longest > MAX_EXPRESSION_TERMS:
        raise BeyondLimits(f"an expression of {longest} terms (limit MAX_EXPRESSION_TERMS={MAX_EXPRESSION_TERMS})")
    return found


@dataclass(frozen=True, slots=True)
class Mention:
    """A number written in prose (in no equation or expression) and the words around it.

    Attributes:
        value: the number.
        before: the words of its sentence before it, nearest last (at most :data:`MENTION_WORDS`).
        after: the word right after it (``None``: punctuation or the end of the text comes first).
        following: the words of its sentence after it, at most :data:`FOLLOWING_WORDS`.
    """

    value: Fraction
    before: tuple[str, ...]
    after: str | None
    following: tuple[str, ...] = ()


#: Words of a sentence kept before a mentioned number (a bound: the work stays linear in the text).
MENTION_WORDS = 12
#: Words of a sentence kept after a mentioned number ("16 more stickers than Sam sold").
FOLLOWING_WORDS = 5
_SENTENCE_END = frozenset(".!?;:\n")


def mentions(text: str) -> list[Mention]:
    """The numbers of ``text`` written in prose: in a run with no operator and no ``=`` ("Ben has 2
    apples", "4 more"), each with the words of its sentence before it and the word after it."""
    raw = [(kind, value) for kind, value in _tokens(text) if kind != "space"]
    found = []
    for run in _indexed_runs(raw):
        if any(token in ("+", "-", "*", "/", "=") for _, token in run):
            continue
        for index, token in run:
            if not isinstance(token, Fraction):
                continue
            before: list[str] = []
            j, stop = index - 1, max(-1, index - 3 * MENTION_WORDS)  # tokens looked at: bounded too
            while j > stop and len(before) < MENTION_WORDS:
                kind, word = raw[j]
                if kind == "other" and word in _SENTENCE_END:
                    break
                if kind == "word":
                    before.append(word)
                j -= 1
            nxt = raw[index + 1] if index + 1 < len(raw) else None
            after = nxt[1] if nxt is not None and nxt[0] == "word" else None
            rest: list[str] = []
            j = index + 1
            while j < len(raw) and j <= index + 3 * FOLLOWING_WORDS and len(rest) < FOLLOWING_WORDS:
                kind, word = raw[j]
                if kind == "other" and word in _SENTENCE_END:
                    break
                if kind == "word":
                    rest.append(word)
                j += 1
            found.append(Mention(token, tuple(reversed(before)), after, tuple(rest)))
    return found


def find_equations(text: str) -> list[Equation]:
    """The equations of ``text`` that compute something: at least two sides, one with an operator.

    ``3 + 4 = 7`` and ``Total = 3 + 4 = 7`` (the word side is dropped) are equations; ``4 more = 7``
    (no operator) and ``3 + 4`` (no ``=``) are not.
    """
    equations: list[Equation] = []
    for tokens in runs(text):
        sides: list[list[str | Fraction]] = [[]]
        for token in tokens:
            if token == "=":
                sides.append([])
            else:
                sides[-1].append(token)
        # Strip dangling operators and parentheses at the run's ends ("= 7." or "(3 + 4 = 7").
        cleaned = [tuple(_trim(side)) for side in sides]
        cleaned = [side for side in cleaned if side]
        if len(cleaned) >= 2 and any(has_operator(side) for side in cleaned):
            shown = " = ".join(" ".join(show(t) for t in side) for side in cleaned)
            equations.append(Equation(sides=tuple(cleaned), text=shown))
    return equations


def _trim(side: list[str | Fraction]) -> list[str | Fraction]:
    # Indices, not repeated slicing: a run ending in many operators stays linear.
    start, end = 0, len(side)
    while end > start and side[end - 1] in ("+", "-", "*", "/", "("):
        end -= 1
    while start < end and side[start] in ("+", "*", "/", ")"):
        start += 1
    side = side[start:end]
    if side.count("(") != side.count(")"):
        side = [t for t in side if t not in ("(", ")")]
    return side


def show(token: str | Fraction) -> str:
    if isinstance(token, Fraction):
        return str(token.numerator) if token.denominator == 1 else f"{float(token):g}"
    return token


def stated_numbers(text: str) -> list[Fraction]:
    """Numbers of ``text`` outside its equations (labels, ordinals and the answer sentence removed)."""
    # Each number of an equation cancels one occurrence of it, the first (a multiset difference).
    in_equations = Counter(n for eq in find_equations(text) for n in eq.numbers())
    remaining = []
    for n in (t for tokens in runs(text) for t in tokens if isinstance(t, Fraction)):
        if in_equations[n] > 0:
            in_equations[n] -= 1
        else:
            remaining.append(n)
    return remaining


def bare_expression_values(text: str) -> list[Fraction]:
    """Values of expressions written without a result (``he must have 3 + 1 books``): each one is a
    quantity the step asserts, as much as a stated number is."""
    values = []
    for tokens in runs(text):
        if "=" in tokens:
            continue
        side = _trim(list(tokens))
        value = evaluate(side) if has_operator(side) else None
        if value is not None:
            values.append(value)
    return values


_RESULT_CUE_RE = re.compile(
    # a number after a cue word, in the same clause, not the start of an expression ...
    r"\b(?:total|left|now|in all|altogether|remaining|remain)\b[^.,;:!?\n]{0,40}?\$?"
    r"(\d+(?:\.\d+)?)(?![\d.]*\s*[+\-*/x×=])"
    # ... or before one ("2 stickers left", "12 apples in total", "9 pencils are his now")
    r"|(\d+(?:\.\d+)?)\s+(?:[a-z]+\s+){0,3}?(?:left|remaining|in all|altogether|in total|now)\b",
    flags=re.IGNORECASE,
)


def result_claims(text: str) -> list[Fraction]:
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


def number_words(text: str) -> list[Fraction]:
    """Numbers written as words (``two`` .. ``twenty``): never an error on their own, but unverified."""
    return [Fraction(_NUMBER_WORDS[m.group(1).lower()]) for m in _NUMBER_WORD_RE.finditer(text)]
