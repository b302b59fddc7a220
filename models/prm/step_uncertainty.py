"""A step's token uncertainty under the frozen backbone: the scalar half of a step's features.

UnPRM (Sec. 2-3) builds on the finding that a model errs where it is unsure of its tokens: "errors
being more likely when the model is uncertain", read from the token-level logits. A step's hidden
state at its end says little about whether ``8 - 5 = 1`` holds; the backbone's own distribution over
the ``1`` does: it puts most of its mass on ``3``. So besides the hidden state, each step gets the
statistics below of the tokens it is made of, each token ``x_i`` read from the backbone's next-token
distribution ``p(· | x_<i)`` at the position before it:

- ``c_i = log p(x_i | x_<i)``, the token's log-probability;
- ``g_i = max_v log p(v | x_<i) - c_i >= 0``, its gap to the most likely token (0: the top choice);
- ``H_i = -Σ_v p(v | x_<i) log p(v | x_<i)``, the entropy of the distribution it was drawn from.

Over all the step's tokens: ``min c``, ``mean c``, ``max g``, ``mean H``, ``max H``, ``log(1 + #{g > 0})``
and ``log(1 + n)``; over its digit tokens alone (numbers are where arithmetic goes wrong): ``min c``,
``max g``, ``mean g``, ``log(1 + #{g > 0})`` and ``log(1 + n_digits)`` (0 for each where the step has
no digit). The step tag after the step is not one of its tokens.

(Not :func:`prmloop.models.uncertainty.step_uncertainty`, UnPRM's ``u(s_t)`` from sampled log-probs,
which the scorer publishes.) Measured with ``prmloop bench deep --arms frozen,hidden`` on the shipped
test set's held-out half (docs/scoreboard.md, "Token uncertainty as features"): the heads on the hidden
state and these 12 numbers beat the hidden state alone by 0.04-0.11 F1 at 30-120 exact labels (paired
bootstrap intervals above zero), and are within noise of it from 240 labels on (equal at 812).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["UNCERTAINTY_FEATURES", "digit_tokens", "step_token_statistics"]

#: The names of the statistics, in the order they follow the hidden state in a step's feature row.
UNCERTAINTY_FEATURES: tuple[str, ...] = (
    "logprob_min",
    "logprob_mean",
    "gap_max",
    "entropy_mean",
    "entropy_max",
    "log1p_off_top",
    "log1p_tokens",
    "digit_logprob_min",
    "digit_gap_max",
    "digit_gap_mean",
    "digit_log1p_off_top",
    "digit_log1p_tokens",
)
#: A gap below this is the top choice (ties and float noise).
_TOP = 1e-6


def digit_tokens(tokenizer: Any, size: int) -> Any:
    """A ``(size,)`` bool tensor: which token ids spell a digit (ids the tokenizer lacks: none)."""
    import torch

    names = tokenizer.convert_ids_to_tokens(list(range(min(size, len(tokenizer)))))
    flags = [name is not None and any(ch.isdigit() for ch in name) for name in names]
    return torch.tensor(flags + [False] * (size - len(flags)), dtype=torch.bool)


def step_token_statistics(logits: Any, tokens: Any, digits: Any, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """``(len(spans), 12)`` float32: the statistics of :data:`UNCERTAINTY_FEATURES` per step.

    ``logits[j]`` is the backbone's next-token logits that predict ``tokens[j]`` (row ``j`` read at the
    position before token ``j``); a step is the half-open row range ``spans[t]`` of them; ``digits``
    flags the vocabulary's digit tokens (:func:`digit_tokens`).
    """
    import torch

    out = np.zeros((len(spans), len(UNCERTAINTY_FEATURES)), dtype=np.float32)
    if not len(spans) or tokens.numel() == 0:
        return out
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    gap = (logp.max(dim=-1).values - chosen).clamp_min(0.0)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    is_digit = digits[tokens]
    for row, (start, end) in enumerate(spans):
        if end <= start:
            continue
        c, g, h, d = chosen[start:end], gap[start:end], entropy[start:end], is_digit[start:end]
        values = [
            c.min(),
            c.mean(),
            g.max(),
            h.mean(),
            h.max(),
            torch.log1p((g > _TOP).sum().float()),
            torch.log1p(torch.tensor(float(end - start))),
        ]
        if d.any():
            dc, dg = c[d], g[d]
            values += [
                dc.min(),
                dg.max(),
                dg.mean(),
                torch.log1p((dg > _TOP).sum().float()),
                torch.log1p(d.sum().float()),
            ]
        else:
            values += [torch.tensor(0.0)] * 5
        out[row] = torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in values]).numpy()
    return out
