"""Split a solution into steps and map every step to the tokens that produced it.

Step-level quantities (UnPRM's step uncertainty, EpicPRM's per-step ``PPL``, CoT entropy) are sums or
means of per-token log-probabilities over a step. A sampled :class:`~prmloop.models.backends.base.Completion`
carries its tokens and their log-probabilities; this module finds where each step starts and ends in
the text (:func:`split_steps`), where each token starts and ends in the same text
(:func:`token_char_spans`, by incremental decoding), and joins the two (:func:`align_steps`).

Step formats (see :mod:`prmloop.models.prompts`): ``step_k`` (``Step k:`` markers, EpicPRM A.1) and
``double_newline`` (blank-line separated, Qwen "Lessons" Sec. 2 and ProcessBench).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prmloop.models.backends.base import tokens_perplexity

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from prmloop.models.backends.base import Completion

__all__ = [
    "Step",
    "TokenStep",
    "align_steps",
    "split_completion",
    "split_steps",
    "token_char_spans",
]

SplitStyle = Literal["step_k", "double_newline", "auto"]

_STEP_MARKER_RE = re.compile(r"(?:(?<=\s)|^)Step\s*(\d+)\s*[:.]\s*", flags=re.IGNORECASE)
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n\s*")
_REPLACEMENT = "\ufffd"


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a solution, located in the solution's text.

    Attributes:
        index: 0-based position among the steps.
        text: the step's content, without its ``Step k:`` marker and surrounding whitespace.
        start: offset in the source text where the step begins (its marker, if any).
        end: offset where the next step begins (or the end of the text): the step's span includes its
            trailing separator, so ``source[:step.end]`` is the prefix to continue for rollouts, and
            the spans of all steps tile the text after ``steps[0].start``.
    """

    index: int
    text: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class TokenStep:
    """A step with the tokens that produced it.

    Attributes:
        step: the step and its character span.
        token_start, token_end: the step's tokens are ``token_ids[token_start:token_end]``.
        logprobs: those tokens' log-probabilities.
    """

    step: Step
    token_start: int
    token_end: int
    logprobs: tuple[float, ...]

    @property
    def sum_logprob(self) -> float:
        return math.fsum(self.logprobs)

    @property
    def perplexity(self) -> float:
        """``exp(-mean log p)`` over the step's tokens (EpicPRM eq. 3); ``inf`` for a step with no tokens."""
        return tokens_perplexity(self.logprobs)


def _detect(text: str) -> Literal["step_k", "double_newline"]:
    return "step_k" if len(_STEP_MARKER_RE.findall(text)) >= 1 else "double_newline"


def split_steps(text: str, style: SplitStyle = "auto") -> list[Step]:
    """The steps of ``text`` in ``style`` (``auto``: ``step_k`` if a ``Step k:`` marker occurs).

    ``step_k``: a step starts at each ``Step k:`` marker (at the start of the text or after
    whitespace); text before the first marker (EpicPRM's ``Response: Let's think step by step.``) is
    not a step. ``double_newline``: steps are the non-blank chunks between blank lines. Empty steps are
    dropped.

    Examples:
        >>> [s.text for s in split_steps("Step 1: a = 2.\\nStep 2: b = 3.")]
        ['a = 2.', 'b = 3.']
        >>> [s.text for s in split_steps("First.\\n\\nSecond.\\n\\n")]
        ['First.', 'Second.']
    """
    chosen = _detect(text) if style == "auto" else style
    spans: list[tuple[int, int, int]] = []  # (span start, content start, span end)
    if chosen == "step_k":
        markers = list(_STEP_MARKER_RE.finditer(text))
        for i, marker in enumerate(markers):
            end = markers[i + 1].start() if i + 1 < len(markers) else len(text)
            spans.append((marker.start(), marker.end(), end))
    else:
        starts = [0] + [m.end() for m in _BLANK_LINE_RE.finditer(text)]
        leading = len(text) - len(text.lstrip())
        for i, start in enumerate(starts):
            span_start = max(start, leading) if i == 0 else start
            end = starts[i + 1] if i + 1 < len(starts) else len(text)
            spans.append((span_start, span_start, end))
    steps: list[Step] = []
    for span_start, content_start, end in spans:
        content = text[content_start:end].strip()
        if content:
            steps.append(Step(index=len(steps), text=content, start=span_start, end=end))
        elif steps:
            # An empty chunk (e.g. a trailing separator) belongs to the step before it.
            last = steps[-1]
            steps[-1] = Step(index=last.index, text=last.text, start=last.start, end=end)
    return steps


def token_char_spans(
    tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], *, skip_special_tokens: bool = True
) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of each token in ``tokenizer.decode(token_ids)``.

    Incremental decoding: the text decoded from the first ``k`` tokens is a prefix of the full text,
    so token ``k`` covers the characters it adds. A token that ends inside a multi-byte character
    (decoded as U+FFFD) adds nothing until the character completes. Special tokens skipped in
    decoding get empty spans. Prefer this over re-tokenising the text: sampled tokens need not be
    the tokenizer's canonical encoding of their text.
    """
    spans: list[tuple[int, int]] = []
    ids = list(token_ids)
    full = str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
    previous = 0
    for k in range(1, len(ids) + 1):
        prefix = str(tokenizer.decode(ids[:k], skip_special_tokens=skip_special_tokens))
        stable = len(prefix.rstrip(_REPLACEMENT)) if k < len(ids) else len(full)
        if not full.startswith(prefix[:stable]):
            # Decoding is not prefix-stable here (a normalising decoder); fall back to the full text.
            stable = previous
        stable = max(stable, previous)
        spans.append((previous, stable))
        previous = stable
    return spans


def _anchor(text: str, span: tuple[int, int]) -> int:
    """Where a token "starts" for step assignment: its first non-whitespace character, if any.

    A token such as ``" Step"`` begins the step its word begins; a whitespace-only token (a
    separator) stays with the step before it.
    """
    start, end = span
    piece = text[start:end]
    stripped = len(piece) - len(piece.lstrip())
    return start + stripped if stripped < len(piece) else start


def align_steps(
    text: str, steps: Sequence[Step], spans: Sequence[tuple[int, int]], logprobs: Sequence[float]
) -> list[TokenStep]:
    """Assign the tokens of ``text`` (``spans``, from :func:`token_char_spans`) to ``steps``.

    Token ``t`` belongs to the last step whose ``start`` is at or before the token's first
    non-whitespace character (whitespace-only tokens: their first character). Tokens before the first
    step, such as a response preamble, belong to no step; a token that straddles a boundary belongs to
    the step it starts in; tokens after the end of ``text`` belong to the last step.
    """
    if len(spans) != len(logprobs):
        raise ValueError(f"got {len(spans)} token spans but {len(logprobs)} log-probabilities")
    ranges: list[list[int]] = [[-1, -1] for _ in steps]
    step = -1
    for t, span in enumerate(spans):
        start = _anchor(text, span)
        while step + 1 < len(steps) and steps[step + 1].start <= start:
            step += 1
        if step < 0:
            continue
        if ranges[step][0] < 0:
            ranges[step][0] = t
        ranges[step][1] = t + 1
    out = []
    previous_end = next((r[0] for r in ranges if r[0] >= 0), len(spans))
    for step_, (first, last) in zip(steps, ranges, strict=True):
        # A step no token starts in (two steps inside one token) gets an empty range where it is.
        lo, hi = (first, last) if first >= 0 else (previous_end, previous_end)
        out.append(TokenStep(step=step_, token_start=lo, token_end=hi, logprobs=tuple(logprobs[lo:hi])))
        previous_end = hi
    return out


def split_completion(
    tokenizer: PreTrainedTokenizerBase, completion: Completion, style: SplitStyle = "auto"
) -> list[TokenStep]:
    """The steps of a sampled completion, each with its tokens and their log-probabilities.

    Offsets are computed on the decoded tokens; for a completion cut at a stop string, the tokens
    after the cut belong to the last step.
    """
    spans = token_char_spans(tokenizer, completion.token_ids)
    decoded = str(tokenizer.decode(list(completion.token_ids), skip_special_tokens=True))
    # Split the completion's own text (cut before a stop string) when it is a prefix of the decoding.
    text = completion.text if decoded.startswith(completion.text) else decoded
    return align_steps(decoded, split_steps(text, style), spans, completion.logprobs)
