"""Final answers in free text: where a solution states its answer, and a normalised key for it.

:func:`extract_answer` finds the final answer: the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested
braces allowed), else the last ``The (final) answer is ...``, else the last ``#### ...`` (GSM8K), so
generators that box their answers and ones that say "The answer is N" are graded alike.
:func:`normalize_answer` gives the cheap string key that :mod:`prmloop.models.grading` compares before
asking math-verify.
"""

from __future__ import annotations

import re

__all__ = ["answer_end", "answer_or_bare", "extract_answer", "last_boxed", "normalize_answer"]

# --------------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS_RE = re.compile(r"(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*:?\s*(?P<ans>[^\n]+)", flags=re.IGNORECASE)
_HASHES_RE = re.compile(r"####\s*(?P<ans>[^\n]+)")
_INLINE_MATH_RE = re.compile(r"^\$+(?P<inner>.+?)\$+")


def _boxed_contents(text: str) -> list[str]:
    """All ``\\boxed{...}`` / ``\\fbox{...}`` contents in order, honouring nested braces.

    An unbalanced final box (generation cut off by the token limit) is ignored.
    """
    return [text[start : end - 1] for start, end in _boxed_spans(text)]


_BRACE_RE = re.compile(r"\\[{}]|[{}]")


def _boxed_spans(text: str) -> list[tuple[int, int]]:
    """(content start, index after the closing brace) of every complete box, in order.

    One pass pairs every brace with its match (``\\{`` and ``\\}`` are text, not braces), so text
    with many unclosed boxes costs linear time, where scanning from each box to the end of the text
    was quadratic (140 kB of ``\\boxed{`` took minutes).
    """
    starts = [match.end() for match in _BOXED_RE.finditer(text)]
    if not starts:
        return []
    closing: dict[int, int] = {}
    opened: list[int] = []
    for brace in _BRACE_RE.finditer(text):
        if brace.group() == "{":
            opened.append(brace.start())
        elif brace.group() == "}" and opened:
            closing[opened.pop()] = brace.start()
    return [(start, closing[start - 1] + 1) for start in starts if start - 1 in closing]


# "The answer is 18." closed by a full stop before white space (not a decimal point), or by a line end.
_ANSWER_CLOSED_RE = re.compile(
    r"\bthe\s+(?:final\s+)?answer\s+is\s*:?\s*[^\n]*?\S(?:\.(?=\s)|(?=\n))", flags=re.IGNORECASE
)


def answer_end(text: str) -> int | None:
    """Where a generation's final answer is complete: the index just after the first closed
    ``\\boxed{...}`` / ``\\fbox{...}``, or after ``The answer is X`` once a full stop and white space
    (or a line break) closed it. ``None`` while no answer is determined yet.

    A rollout only needs its answer (MC annotation grades nothing else), so generation can stop there.

    ``"The answer is 3."`` is not closed yet: the next token may make it ``3.5``.
    """
    ends = [end for _, end in _boxed_spans(text)][:1]
    said = _ANSWER_CLOSED_RE.search(text)
    if said is not None:
        ends.append(said.end() + (1 if text[said.end() : said.end() + 1] == "." else 0))
    return min(ends) if ends else None


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, else ``None``."""
    boxed = _boxed_contents(text)
    return boxed[-1].strip() if boxed else None


def _clean_tail(answer: str) -> str:
    """Trim a line-style answer (``The answer is $x$.``, ``#### 18``) down to the answer itself."""
    answer = answer.strip()
    inline = _INLINE_MATH_RE.match(answer)
    if inline:
        answer = inline.group("inner")
    answer = answer.strip().rstrip(".").strip()
    answer = answer.strip("$").strip()
    # An unbalanced brace means the answer was cut off (token limit): there is no answer to read.
    return answer if answer.count("{") == answer.count("}") else ""


def extract_answer(text: str) -> str | None:
    """The final answer stated in ``text``, or ``None`` if it states none.

    Order of precedence (the formats of MATH / PRM800K, EpicPRM's 2-shot prompt, and GSM8K):

    1. the content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces allowed);
    2. the rest of the line after the last ``The (final) answer is`` / ``Answer:``, with ``$...$``
       and a trailing full stop removed;
    3. the rest of the line after the last ``####``.

    Examples:
        >>> extract_answer(r"so $x = \\boxed{\\frac{1}{2}}$.")
        '\\\\frac{1}{2}'
        >>> extract_answer("Step 3: 9 * 2 = 18. The final answer is 18.")
        '18'
        >>> extract_answer("She makes $18.\\n#### 18")
        '18'
        >>> extract_answer("I give up") is None
        True
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in (_ANSWER_IS_RE, _HASHES_RE):
        matches = list(pattern.finditer(text))
        if matches:
            cleaned = _clean_tail(matches[-1].group("ans"))
            if cleaned:
                return cleaned
    return None


_BARE_ANSWER_MAX_CHARS = 64
_MATHY_RE = re.compile(r"[0-9\\^=(){}\[\]/+*<>_|]")
_SINGLE_WORD_RE = re.compile(r"^[A-Za-z]+$")


def answer_or_bare(text: str) -> str | None:
    """The answer in ``text``: extracted if it has a marker, else ``text`` itself if it looks like one.

    A bare answer is a single short line that contains something mathematical (a digit, a LaTeX
    command, an operator or bracket) or is a single word (MATH has answers such as ``Evelyn``).
    Anything else without an answer marker (``I don't know``) has no answer.
    """
    extracted = extract_answer(text)
    if extracted is not None:
        return extracted
    stripped = _clean_tail(text)
    if not stripped or "\n" in stripped or len(stripped) > _BARE_ANSWER_MAX_CHARS:
        return None
    if _MATHY_RE.search(stripped) or _SINGLE_WORD_RE.match(stripped):
        return stripped
    return None


# --------------------------------------------------------------------------------------------------
# Normalisation (fast path only: equal keys imply equivalent answers; unequal keys decide nothing)
# --------------------------------------------------------------------------------------------------

_NORMALIZE_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "\\displaystyle")
_NORMALIZE_SUBS = (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\le ", "\\leq "), ("\\ge ", "\\geq "))


def normalize_answer(answer: str) -> str:
    """A conservative canonical key: two answers with the same key are the same answer.

    Removes whitespace, ``$``, ``\\left``/``\\right``, LaTeX spacing commands and a trailing full
    stop, and maps ``\\dfrac``/``\\tfrac`` to ``\\frac``. It never rewrites values (no unit stripping,
    no number formatting), so it cannot merge different answers; math-verify handles the rest.
    """
    key = answer.strip()
    for old, new in _NORMALIZE_SUBS:
        key = key.replace(old, new)
    for token in _NORMALIZE_DROP:
        key = key.replace(token, "")
    key = "".join(key.split())
    return key.rstrip(".")
