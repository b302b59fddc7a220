"""What a step says about the question's quantities: each number's role, read from the words around it.

The curriculum writes every number of a question in one of a few phrases (``Ben has 2 apples``, ``He
buys 5 more apples``, ``She gives 3 apples to Zoe``, ``3 bags with 4 apples``, ``among 3 friends``,
``Zoe has 7 cookies``, ``Ben is 9 years old``). A step that writes a question number in prose is read
the same way: the verb before it (``has``, ``buys``, ``gives``, ... in families: what a person *has*,
*acquires*, *removes*), the word after it and who the sentence is about. Three outcomes:

- *matches*: the step says what the question says of that number (same verb family, same next word
  up to ``more`` and the singular, about the same person): a restatement, correct;
- *contradicts*: the step gives the number to an action the question gives to other numbers ("Ben
  finds 2 more" when Ben has 2 and finds 3), or says the main person *has* a number of the items that
  is no count the story ever reaches ("He has 5 apples" when he has 2 and buys 5): a wrong step. Only
  claimed where nothing else can be meant: the question adds and subtracts only (no bags, no
  sharing), the sentence is about the main person (by name or pronoun) and names nobody else in this
  step or the one before, and the number is no result and no sum of that action's amounts;
- neither: the checker does not decide from these words (the step stays unverified).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from prmloop.models.arith.equations import Mention, mentions

__all__ = ["QuestionRoles", "Reading", "read_mention"]

_FAMILIES: dict[str, str] = {
    **dict.fromkeys(("has", "have", "had", "having", "owns", "own", "owned"), "have"),
    **dict.fromkeys(
        ("buys", "buy", "bought", "buying", "finds", "find", "found", "finding", "gets", "get", "got", "getting"),
        "acquire",
    ),
    **dict.fromkeys(
        ("gives", "give", "gave", "giving", "loses", "lose", "lost", "losing", "sells", "sell", "sold", "selling"),
        "remove",
    ),
    **dict.fromkeys(("shares", "share", "shared", "among"), "share"),
}
# Words skipped between a verb and its number ("has a total of 7", "buys another 5", "gives away 3").
_FILLERS = frozenset(
    ("now", "only", "still", "then", "also", "just", "another", "already", "a", "total", "of", "all", "away")
)
_PRONOUNS = frozenset(("he", "she", "they"))
_NEGATIONS = frozenset(("longer", "not", "no", "t", "never"))
_COMPARING = frozenset(("than", "times", "fewer", "less"))
#: Words after a number that name the question's items or leave them implied ("sells 5.", "6 of them").
_IMPLIED = frozenset((None, "of", "more"))
# Capitalised words that start sentences and are no person's name.
_NOT_NAMES = frozenset(
    (
        "the",
        "so",
        "then",
        "he",
        "she",
        "they",
        "it",
        "if",
        "after",
        "now",
        "there",
        "this",
        "that",
        "in",
        "at",
        "each",
        "total",
        "first",
        "next",
        "finally",
        "since",
        "we",
        "i",
        "a",
        "an",
        "and",
        "but",
        "step",
        "answer",
        "to",
        "for",
        "therefore",
        "thus",
        "when",
        "let",
        "both",
        "her",
        "his",
        "their",
        "him",
        "them",
        "how",
        "what",
        "final",
        "because",
        "as",
        "with",
        "from",
        "on",
        "of",
        "by",
        "or",
        "all",
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
    )
)
_QUESTION_ITEMS = re.compile(r"How many (\w+)")
_WORD = re.compile(r"[A-Za-z]+")


def _singular(word: str) -> str:
    word = word.lower()
    return word[:-1] if word.endswith("s") and len(word) > 3 else word


@dataclass(frozen=True, slots=True)
class Reading:
    """How a sentence uses a number: the verb family (or the word) before it, the word after it (its
    singular, or ``more``), who the sentence is about before the verb (``"main"``, another person's
    name in lower case, or ``None`` when it names nobody), and whether it names anyone but the main
    person before the number."""

    verb: str | None
    after: str | None
    subject: str | None
    others_named: bool


def read_mention(mention: Mention, main: str | None, items: str | None = None) -> Reading:
    """How ``mention``'s sentence uses its number (``main``: the question's person, ``items``: the
    singular of what the question counts, never read as a name)."""
    words = list(mention.before)
    verb: str | None = None
    verb_at = len(words)
    for i in range(len(words) - 1, -1, -1):
        word = words[i].lower()
        if word in _FILLERS:
            continue
        verb, verb_at = _FAMILIES.get(word, word), i
        if verb == "have" and i and words[i - 1].lower() in _NEGATIONS:
            verb = "remove"  # "no longer has 6 of them", "does not have 6"
        break
    if any(w.lower() in _COMPARING for w in mention.following):
        verb = "compare"  # "found 16 more stickers than Sam sold": not the amount found
    subject: str | None = None
    others = False
    for i, word in enumerate(words):
        person = _person(word, main, items)
        others = others or (person is not None and person != "main")
        if i < verb_at and person is not None:
            subject = person
    after = mention.after.lower() if mention.after else None
    return Reading(verb, None if after is None else ("more" if after == "more" else _singular(after)), subject, others)


def _person(word: str, main: str | None, items: str | None) -> str | None:
    """``"main"`` for the main person (by name or pronoun), another name in lower case, else ``None``."""
    lower = word.lower()
    if lower in _PRONOUNS or (main is not None and lower == main.lower()):
        return "main"
    if not word[:1].isupper() or lower in _NOT_NAMES or lower in _FAMILIES or _singular(lower) == items:
        return None
    return lower


@dataclass(frozen=True)
class QuestionRoles:
    """The question's numbers as its sentences use them, and what a step may be held to.

    Attributes:
        main: the question's person (its first word), ``items`` the singular of what they count.
        uses: for each number of the question, how the question's sentences use it.
        linear: the question only adds and subtracts (contradictions are claimed only then).
        totals: every count the story reaches (the start and each result of the chain).
    """

    main: str
    items: str | None
    uses: dict[Fraction, tuple[Reading, ...]]
    linear: bool
    totals: frozenset[Fraction]
    amounts: dict[str, frozenset[Fraction]]

    @classmethod
    def from_problem(cls, problem: str, *, linear: bool, totals: Iterable[Fraction]) -> QuestionRoles | None:
        """The roles of a curriculum question's numbers, read from its text (``None`` if it has no words)."""
        words = problem.split()
        if not words:
            return None
        main = re.sub(r"\W", "", words[0])
        found = _QUESTION_ITEMS.search(problem)
        items = _singular(found.group(1)) if found else None
        uses: dict[Fraction, list[Reading]] = {}
        for mention in mentions(problem):
            uses.setdefault(mention.value, []).append(read_mention(mention, main, items))
        amounts: dict[str, set[Fraction]] = {}
        for value, readings in uses.items():
            for reading in readings:
                if reading.verb in ("acquire", "remove"):
                    amounts.setdefault(reading.verb, set()).add(value)
        return cls(
            main=main,
            items=items,
            uses={value: tuple(readings) for value, readings in uses.items()},
            linear=linear,
            totals=frozenset(totals),
            amounts={verb: frozenset(values) for verb, values in amounts.items()},
        )

    def read(self, mention: Mention) -> Reading:
        return read_mention(mention, self.main, self.items)

    def matches(self, value: Fraction, reading: Reading) -> bool:
        """The step says of ``value`` what the question says: a restatement."""
        for use in self.uses.get(value, ()):
            same_after = reading.after == use.after or (self._items(reading.after) and self._items(use.after))
            if use.subject in (None, "main"):
                about = reading.subject in (None, "main") and not reading.others_named
            else:
                about = reading.subject == use.subject
            if reading.verb == use.verb and same_after and about:
                return True
        return False

    def contradiction(
        self, value: Fraction, reading: Reading, *, results: Collection[Fraction], others_nearby: bool
    ) -> str | None:
        """Why the step's use of the question number ``value`` is wrong, or ``None`` if it may be right.

        ``results``: the counts derived or reachable by now; ``others_nearby``: this step or the one
        before names someone else (a pronoun may then mean them)."""
        if not self.linear or value not in self.uses or others_nearby or reading.others_named:
            return None
        if reading.subject not in (None, "main"):
            return None
        if value in results:
            return None
        shown = str(value.numerator) if value.denominator == 1 else str(value)
        said = "; ".join(sorted({_describe(use) for use in self.uses[value]}))
        if reading.verb in ("acquire", "remove"):
            amounts = self.amounts.get(reading.verb, frozenset())
            if value in amounts or (len(amounts) > 1 and value == sum(amounts)):
                return None
            action = "gets" if reading.verb == "acquire" else "gives away, loses or sells"
            return f"says {self.main} {action} {shown}, but in the question {shown} is {said}"
        if reading.verb == "have" and reading.after == self.items and value not in self.totals:
            return f"says {self.main} has {shown} {self.items}s, a count the story never reaches ({shown} is {said})"
        return None

    def _items(self, after: str | None) -> bool:
        return after in _IMPLIED or after == self.items

    def others_named(self, steps: Sequence[str]) -> bool:
        """Whether ``steps`` name a person other than the main one (a pronoun may then mean them)."""
        return any(
            _person(word, self.main, self.items) not in (None, "main") for step in steps for word in _WORD.findall(step)
        )


def _describe(use: Reading) -> str:
    if use.subject not in (None, "main"):
        return "someone else's"
    return {
        "have": "what they have at the start",
        "acquire": "an amount they get",
        "remove": "an amount they give away, lose or sell",
    }.get(use.verb or "", f"the number after '{use.verb}'")
