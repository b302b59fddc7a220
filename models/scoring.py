"""Teacher-forced log-probabilities of a solution's steps, for solutions that carry none.

Imported solutions and API outputs come without token log-probabilities; the step scorer recomputes
them with the same prompt the sampler would have used (:func:`~prmloop.models.prompts.solution_prompt`)
and the steps written as :func:`~prmloop.models.prompts.format_steps` writes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from prmloop.models.backends.base import Scorer, TokenIdScorer
from prmloop.models.prompts import StepFormat, format_steps

__all__ = ["teacher_forced_logprobs"]


def teacher_forced_logprobs(
    scorer: Scorer, prompt: str, steps: Sequence[str], style: StepFormat
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Teacher-forced log-probabilities of ``steps`` after ``prompt`` and the token offset of each step.

    Step ``t`` is written as ``format_steps([steps[t]], style, start=t + 1)``. A
    :class:`~prmloop.models.backends.base.TokenIdScorer` tokenises the prompt (its own prompt encoding)
    and each step separately and scores the concatenation in one call. Any other scorer gets one
    ``score`` pair per step: ``(prompt + steps[:t], step t)``. The two agree wherever the steps
    tokenise the same alone as after their predecessors (true of ``Step k:`` lines).

    Raises:
        ValueError: from the scorer (an empty prompt, for instance).
    """
    pieces = [format_steps([step], style, start=t + 1) for t, step in enumerate(steps)]
    if isinstance(scorer, TokenIdScorer):
        prompt_ids = list(scorer.encode_prompt(prompt))
        piece_ids = [list(scorer.tokenizer.encode(piece, add_special_tokens=False)) for piece in pieces]
        [scored] = scorer.score_ids([(prompt_ids, [i for ids in piece_ids for i in ids])])
        offsets = tuple(itertools.accumulate((len(ids) for ids in piece_ids[:-1]), initial=0))
        return tuple(scored.logprobs), offsets
    pairs = [(prompt + "".join(pieces[:t]), piece) for t, piece in enumerate(pieces)]
    results = scorer.score(pairs)
    logprobs = tuple(p for r in results for p in r.logprobs)
    offsets = tuple(itertools.accumulate((len(r.logprobs) for r in results[:-1]), initial=0))
    return logprobs, offsets
