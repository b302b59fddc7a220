"""Token-level uncertainty of sampled solutions (UnPRM, Sec. 3 "Uncertainty Estimation").

UnPRM scores a solution of ``n`` tokens from the log-probabilities ``p_1..p_n`` its generator assigned
to them: a softmax over the *sequence* of log-probabilities gives ``z_1..z_n`` and the uncertainty is

    u = -sum_{i=1}^{n} z_i * log(z_i),   z = softmax(p / T)

"higher values of u indicate that the model was generally less confident across the sequence". The
same function applied to the tokens of one step gives the step uncertainty ``u(s_t)``, and UnPRM's
annotator (Algorithm 1, lines 8-11) ranks steps by the delta ``Δu(s_t) = u(s_t) - u(s_{t-1})``.

Temperature ``T``: the paper applies the softmax to the log-probabilities as they are (``T = 1``,
:data:`PAPER_TEMPERATURE`, the default here). UnPRM's public code divides them by a temperature of 5
first (:data:`UNPRM_CODE_TEMPERATURE`), which flattens ``z`` towards uniform, so ``u`` approaches its
maximum ``log n`` and differences between sequences shrink. Both are available through ``temperature``.

Note that ``u`` is bounded by ``log n``: it grows with the number of tokens, so longer solutions
(and longer steps) tend to score as more uncertain. That is the paper's definition and is kept as is.

Also here: mean token negative log-likelihood and perplexity (EpicPRM Eq. 3, ``PPL = exp(-1/L sum
log p)``), and the dispersion of the final answers across the ``k`` samples of one question (the
entropy of the answer distribution).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Hashable, Sequence

from prmloop.models.grading import DEFAULT_TIMEOUT_S, group_equivalent_answers

__all__ = [
    "PAPER_TEMPERATURE",
    "UNPRM_CODE_TEMPERATURE",
    "answer_dispersion",
    "label_entropy",
    "mean_nll",
    "perplexity",
    "rank_steps_by_delta",
    "sequence_entropy",
    "split_by_offsets",
    "step_uncertainty",
    "uncertainty_deltas",
]

PAPER_TEMPERATURE = 1.0
"""``T`` of UnPRM Sec. 3 as written: the softmax is applied to the raw log-probabilities."""

UNPRM_CODE_TEMPERATURE = 5.0
"""``T`` of UnPRM's public code, which divides the log-probabilities by 5 before the softmax."""


def sequence_entropy(logprobs: Sequence[float], *, temperature: float = PAPER_TEMPERATURE) -> float:
    """UnPRM's uncertainty of one token sequence: ``u = -sum_i z_i log z_i`` with ``z = softmax(p / T)``.

    Computed stably as ``u = logsumexp(x) - sum_i z_i x_i`` with ``x = p / T``. An empty sequence has
    ``u = 0`` (the same value as a single token, whose softmax is ``[1]``); this is also ``u(s_0)``,
    the uncertainty of the empty prefix (see :func:`uncertainty_deltas`).

    Args:
        logprobs: ``log p(token_i | context)`` of each generated token.
        temperature: ``T > 0``; 1 is the paper, 5 is UnPRM's code (:data:`UNPRM_CODE_TEMPERATURE`).

    Raises:
        ValueError: ``temperature`` is not positive, or a log-probability is NaN or positive infinity.

    Examples:
        >>> round(sequence_entropy([-1.0, -1.0]), 6) == round(math.log(2), 6)
        True
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if not logprobs:
        return 0.0
    if any(math.isnan(p) or p == math.inf for p in logprobs):
        raise ValueError("log-probabilities must be finite or -inf; got NaN or +inf (a backend bug?)")
    x = [p / temperature for p in logprobs]
    top = max(x)
    if top == -math.inf:
        # Every token impossible: the softmax is undefined; treat as uniform (maximal uncertainty).
        return math.log(len(x))
    weights = [math.exp(v - top) for v in x]
    total = math.fsum(weights)
    log_total = top + math.log(total)
    z = [w / total for w in weights]
    return max(0.0, log_total - math.fsum(zi * xi for zi, xi in zip(z, x, strict=True) if zi > 0.0))


def split_by_offsets(token_logprobs: Sequence[float], step_token_offsets: Sequence[int]) -> list[tuple[float, ...]]:
    """The log-probabilities of each step: step ``t`` is ``token_logprobs[offsets[t]:offsets[t + 1]]``.

    The last step runs to the end of the completion. Offsets are those of ``SolutionSampled``
    (``step_token_offsets``: the token index where each step starts); tokens before the first offset
    (a response preamble) belong to no step.

    Raises:
        ValueError: the offsets decrease or point past the end of the completion.
    """
    n = len(token_logprobs)
    offsets = list(step_token_offsets)
    if not offsets:
        return []
    for a, b in itertools.pairwise(offsets):
        if b < a:
            raise ValueError(f"step_token_offsets must not decrease, got {offsets}")
    if offsets and (offsets[0] < 0 or offsets[-1] > n):
        raise ValueError(f"step_token_offsets {offsets} fall outside the {n} generated tokens")
    ends = [*offsets[1:], n]
    return [tuple(token_logprobs[a:b]) for a, b in zip(offsets, ends, strict=True)]


def step_uncertainty(
    token_logprobs: Sequence[float],
    step_token_offsets: Sequence[int],
    *,
    temperature: float = PAPER_TEMPERATURE,
) -> tuple[float, ...]:
    """``u(s_t)`` for ``t = 1..T``: :func:`sequence_entropy` of each step's own tokens (UnPRM Alg. 1, line 9).

    ``u(s_t) = -sum_{i in s_t} z_i log z_i`` with ``z = softmax(p_{s_t} / T)``, the softmax taken over
    the tokens of step ``t`` only. A step with no tokens has ``u = 0``.

    Args:
        token_logprobs: the completion's per-token log-probabilities (``SolutionSampled.token_logprobs``).
        step_token_offsets: the token index where each step starts (``SolutionSampled.step_token_offsets``).
        temperature: see :func:`sequence_entropy`.
    """
    return tuple(
        sequence_entropy(step, temperature=temperature) for step in split_by_offsets(token_logprobs, step_token_offsets)
    )


def uncertainty_deltas(step_entropy: Sequence[float], *, initial: float = 0.0) -> tuple[float, ...]:
    """``Δu(s_t) = u(s_t) - u(s_{t-1})`` for ``t = 1..T`` (UnPRM Alg. 1, lines 8-11).

    The paper computes deltas for ``t = 2..T`` only. To keep one value per step, ``u(s_0)`` (the empty
    prefix, before the first step) is defined as ``initial``, by default 0, the entropy of an empty
    token sequence; so ``Δu(s_1) = u(s_1)``. Use :func:`rank_steps_by_delta`, which leaves step 1 out
    by default, to get the paper's ordering.

    Examples:
        >>> uncertainty_deltas([1.0, 3.0, 2.5])
        (1.0, 2.0, -0.5)
    """
    previous = initial
    out = []
    for u in step_entropy:
        out.append(u - previous)
        previous = u
    return tuple(out)


def rank_steps_by_delta(deltas: Sequence[float], *, include_first: bool = False) -> tuple[int, ...]:
    """0-based step indices by descending ``Δu`` (UnPRM Alg. 1, line 12: "Sort U in desc. order").

    ``include_first=False`` follows the paper (the list ``U`` holds steps ``t > 1`` only); ties keep
    step order.

    Examples:
        >>> rank_steps_by_delta([1.0, 2.0, -0.5, 2.0])
        (1, 3, 2)
    """
    start = 0 if include_first else 1
    return tuple(sorted(range(start, len(deltas)), key=lambda t: (-deltas[t], t)))


def mean_nll(logprobs: Sequence[float]) -> float:
    """Mean negative log-likelihood per token, ``-(1/L) sum_i log p_i``.

    Raises:
        ValueError: the sequence is empty (the mean is undefined).
    """
    if not logprobs:
        raise ValueError("mean_nll of an empty token sequence is undefined; the completion has no tokens")
    return -math.fsum(logprobs) / len(logprobs)


def perplexity(logprobs: Sequence[float]) -> float:
    """``PPL(X) = exp(-(1/L) sum_i log p(x_i | x_<i))`` (EpicPRM Eq. 3; UnPRM's MC_PPL footnote).

    Raises:
        ValueError: the sequence is empty.
    """
    nll = mean_nll(logprobs)
    try:
        return math.exp(nll)
    except OverflowError:
        return math.inf


def label_entropy(labels: Sequence[Hashable]) -> float:
    """Entropy (nats) of the empirical distribution of ``labels``: ``H = -sum_a f_a log f_a``.

    0 when every label is the same (or there are none); ``log k`` when ``k`` labels all differ.
    """
    if not labels:
        return 0.0
    n = len(labels)
    return max(0.0, -math.fsum((c / n) * math.log(c / n) for c in Counter(labels).values()))


def answer_dispersion(answers: Sequence[str | None], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """Entropy of the final-answer distribution across the ``k`` samples of one question.

    Answers are clustered by equivalence with :func:`prmloop.models.grading.group_equivalent_answers`
    (``0.5`` and ``\\frac{1}{2}`` are one answer), then ``H = -sum_a f_a log f_a`` over the clusters
    (:func:`label_entropy`). Samples with no parseable answer (``None``) are left out: they state no
    answer to disagree with. 0 means every answering sample agrees.
    """
    stated = [a for a in answers if a is not None]
    if not stated:
        return 0.0
    return label_entropy(group_equivalent_answers(stated, timeout_s=timeout_s))
