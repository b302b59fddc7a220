"""What one ``model.generate`` call of the transformers backend needs around the model: the recorder of
each sampled token's log-probability, the generation config and warpers that keep that recorder first,
and the reading of a completion (its end, stop string or stated answer) from the generated ids.

The backend (:mod:`prmloop.models.backends.transformers_backend`) owns the model, its lock, threads and
batching; this module owns how a generation is configured and how its output is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prmloop.models.answers import answer_end
from prmloop.models.backends.base import Completion, FinishReason, SamplingParams
from prmloop.models.backends.stopping import StopInCompletion, first_stop

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["SampledTokenLogprobs", "generation_kwargs", "neutral_generation_config", "read_completion"]


class SampledTokenLogprobs:
    """Logits processor that records ``log_softmax(raw logits)[sampled token]`` for every step.

    At step ``t`` it sees the token chosen at step ``t - 1`` as the last column of ``input_ids`` and
    reads its log-probability from the distribution it kept from step ``t - 1``; :meth:`finish`
    reads the last one after ``generate`` returns. It must run first, before any warper.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []
        self._previous: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        if self._previous is not None:
            self.steps.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self._previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[rows, generated tokens]`` log-probabilities once ``generate`` has returned ``sequences``."""
        import torch

        if self._previous is not None:
            self.steps.append(self._previous.gather(1, sequences[:, -1:]).squeeze(1))
            self._previous = None
        if not self.steps:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.steps, dim=1)


def generation_kwargs(
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    params: SamplingParams,
    copies: int,
    prompt_width: int,
) -> dict[str, Any]:
    """``model.generate`` keyword arguments for ``params``.

    A fresh generation config with neutral sampling values switches every built-in warper off;
    the warpers for ``params`` are passed as ``logits_processor`` so that they run *after* the
    log-probability recorder (custom processors are appended after the built-in ones).
    """
    from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    # Neutral values, set explicitly: generate() fills unset (None) fields from the model's config
    # and then from global defaults (top_k=50), and built-in processors run *before* the recorder.
    config = GenerationConfig(
        do_sample=not params.greedy,
        temperature=1.0,
        top_p=1.0,
        top_k=None if params.greedy else 0,
        num_return_sequences=copies,
        max_new_tokens=params.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=sorted(eos_ids),
    )
    warpers = LogitsProcessorList()
    if not params.greedy and params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if not params.greedy and params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    kwargs: dict[str, Any] = {"generation_config": config, "logits_processor": warpers}
    if params.stop or params.stop_at_answer:
        from transformers import StoppingCriteriaList

        kwargs["stopping_criteria"] = StoppingCriteriaList(
            [StopInCompletion(tokenizer, params.stop, prompt_width, at_answer=params.stop_at_answer)]
        )
    return kwargs


def read_completion(
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    tokens: Sequence[int],
    logprobs: Sequence[float],
    *,
    prompt_tokens: int,
    params: SamplingParams,
) -> Completion:
    """One generated row as a :class:`Completion`: cut at its first end-of-sequence token, else at the
    first stop string or stated answer (``params``), the text decoded from the tokens it keeps."""
    tokens = list(tokens)
    end = len(tokens)
    finish: FinishReason = "length"
    stop_reason: str | None = None
    for i, token in enumerate(tokens):
        if token in eos_ids:
            end, finish = i + 1, "stop"
            break
    if params.stop:
        # The first token whose decoded prefix contains a stop string ends the completion
        # (generation pads finished rows, so later tokens are not samples).
        for k in range(1, end + 1):
            hit = first_stop(str(tokenizer.decode(tokens[:k], skip_special_tokens=True)), params.stop)
            if hit is not None:
                end, finish, stop_reason = k, "stop", hit
                break
    if params.stop_at_answer and stop_reason is None:
        # The first token whose decoded prefix states the answer ends it (the answer kept).
        for k in range(1, end + 1):
            if answer_end(str(tokenizer.decode(tokens[:k], skip_special_tokens=True))) is not None:
                end, finish, stop_reason = k, "stop", "answer"
                break
    text = str(tokenizer.decode(tokens[:end], skip_special_tokens=True))
    if stop_reason == "answer":
        text = text[: answer_end(text)]
    elif stop_reason is not None:
        text = text[: text.index(stop_reason)]
    return Completion(
        text=text,
        token_ids=tuple(tokens[:end]),
        logprobs=tuple(logprobs[:end]),
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        stop_reason=stop_reason,
    )


def neutral_generation_config(config: Any) -> Any:
    """A generation config with only the special-token ids of ``config`` (no sampling defaults)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )
