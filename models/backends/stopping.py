"""Where a local engine's completion ends: stop strings (only in the generated text) and, for rollouts,
a stated final answer. A stopping criterion for ``generate`` and the matching cut of a finished row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["StopInCompletion", "cut_at_answer", "first_stop"]


class StopInCompletion:
    """Stopping criterion: a row is done when its *generated* text contains a stop string, or (with
    ``at_answer``) states its final answer (:func:`~prmloop.models.answers.answer_end`).

    transformers' own ``stop_strings`` also match a stop string that straddles the end of the prompt,
    which vLLM and OpenAI-compatible servers do not; this one looks only after ``prompt_width``.
    For stop strings only a window of recent tokens is decoded per step (enough for the longest one);
    the answer check decodes each unfinished row's whole completion.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], prompt_width: int, at_answer: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_width = prompt_width
        self.window = max((len(stop) for stop in stops), default=0) + 8
        self.at_answer = at_answer
        self._answered: set[int] = set()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        import torch

        from prmloop.models.answers import answer_end

        done = [False] * input_ids.shape[0]
        if self.stops:
            start = max(self.prompt_width, input_ids.shape[1] - self.window)
            tails = self.tokenizer.batch_decode(input_ids[:, start:], skip_special_tokens=True)
            done = [any(stop in tail for stop in self.stops) for tail in tails]
        if self.at_answer:
            rows = [r for r in range(input_ids.shape[0]) if not done[r] and r not in self._answered]
            texts = self.tokenizer.batch_decode(input_ids[rows, self.prompt_width :], skip_special_tokens=True)
            for r, text in zip(rows, texts, strict=True):
                if answer_end(text) is not None:
                    self._answered.add(r)
            done = [d or r in self._answered for r, d in enumerate(done)]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def first_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string that occurs earliest in ``text`` (``None`` if none does)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, stop)
    return None if best is None else best[1]


def cut_at_answer(
    text: str, token_ids: list[int], logprobs: list[float], tokens_before: Callable[[int], int]
) -> tuple[str, list[int], list[float], bool]:
    """Cut a finished completion after its stated answer (a server, or vLLM in process, generates past
    it): the text up to the answer's end and the tokens that start before it (``tokens_before(end)``
    counts them), so perplexities weigh the same tokens as the transformers engine's, which stops there.
    Returns the text, ids, log-probs and whether it cut."""
    from prmloop.models.answers import answer_end

    end = answer_end(text)
    if end is None or not token_ids:
        return text, token_ids, logprobs, False
    keep = tokens_before(end)
    return text[:end], token_ids[:keep], logprobs[:keep], True
