"""The seams every language-model backend implements, and the plain records they return.

Every algorithm in the papers needs the same few things from a model:

- sample ``k`` solutions of a question with the log-probability of every generated token (token-level
  uncertainty, UnPRM Sec. 3; CoT entropy);
- continue a prefix of steps ``n`` times and report each rollout (Monte-Carlo step labels: Math-Shepherd's
  completer, EpicPRM's ``MC`` / ``MC_PPL`` estimates, Sec. 3.1-3.2);
- score a given text after a prompt with teacher forcing (EpicPRM's ``PPL`` term, Sec. 3.2).

Log-probabilities are always the *model's* ``log p(token | context)`` at temperature 1, before
temperature / top-p reshape the sampling distribution, which is what vLLM and OpenAI-compatible servers
report too; they therefore agree with a teacher-forced forward pass of the same model
(:class:`Scorer`), whatever sampling parameters were used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Completion",
    "FinishReason",
    "Generator",
    "SamplingParams",
    "ScoredText",
    "Scorer",
    "TokenIdScorer",
    "Tokenized",
    "tokens_perplexity",
]

FinishReason = Literal["stop", "length"]


def tokens_perplexity(logprobs: Sequence[float]) -> float:
    """``exp(-(1/L) sum_i log p_i)`` of a token sequence (EpicPRM eq. 3); ``inf`` for no tokens."""
    if not logprobs:
        return math.inf
    return math.exp(-math.fsum(logprobs) / len(logprobs))


class SamplingParams(BaseModel):
    """How to sample; one frozen value per request (field descriptions double as CLI help)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(default=1, ge=1, description="completions per prompt (rollouts per prefix)")
    max_new_tokens: int = Field(default=256, ge=1, description="generation budget per completion, in tokens")
    temperature: float = Field(default=1.0, ge=0.0, description="softmax temperature; 0 means greedy decoding")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1 = off)")
    stop: tuple[str, ...] = Field(
        default=(), description="strings that end a completion; the text stops before the first one"
    )
    seed: int | None = Field(
        default=None,
        description="seed that makes one call reproducible (None = not seeded); vary it across calls",
    )
    stop_at_answer: bool = Field(
        default=False,
        description=(
            "end a completion once its final answer is determined (a closed \\boxed{...}, or 'The answer is X' "
            "closed by a full stop or line break), keeping the answer: a rollout needs nothing after it. "
            "The local transformers engine stops generating there; servers generate on and the text is cut"
        ),
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled continuation of a prompt.

    Attributes:
        text: the decoded continuation, special tokens removed, cut before a matched stop string.
        token_ids: every generated token, including an end-of-sequence token and the token(s) that
            completed a stop string (so ``sum(logprobs)`` is the probability of what was sampled).
        logprobs: ``log p(token_ids[i] | prompt, token_ids[:i])`` under the model at temperature 1.
        finish_reason: ``"stop"`` (end-of-sequence token or stop string) or ``"length"`` (budget).
        prompt_tokens: number of prompt tokens the model was conditioned on.
        stop_reason: the stop string that ended the completion, ``None`` otherwise.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"a completion needs one log-probability per token, got {len(self.token_ids)} tokens "
                f"and {len(self.logprobs)} log-probabilities"
            )

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sum_logprob(self) -> float:
        return math.fsum(self.logprobs)


@dataclass(frozen=True, slots=True)
class ScoredText:
    """A continuation scored with teacher forcing after a prompt.

    Attributes:
        token_ids: the continuation's tokens (the prompt's are not repeated here).
        logprobs: ``log p(token_ids[i] | prompt, token_ids[:i])``.
        prompt_tokens: number of prompt tokens.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_tokens: int

    @property
    def sum_logprob(self) -> float:
        return math.fsum(self.logprobs)

    @property
    def perplexity(self) -> float:
        """``exp(-mean log p)``, the PPL of EpicPRM eq. 3 (``inf`` for an empty continuation)."""
        return tokens_perplexity(self.logprobs)


@runtime_checkable
class Generator(Protocol):
    """Samples completions with per-token log-probabilities."""

    model_name: str

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        """``params.n`` completions for each prompt (in prompt order), as few engine calls as possible.

        Prompts are raw text: apply a chat template first (:mod:`prmloop.models.prompts`) when the
        model needs one.
        """
        ...

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        """Continue ``prefix`` (prompt plus the steps so far) ``n`` times in one batched call."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """Teacher-forced log-probabilities of given text."""

    model_name: str

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        """Per-token log-probabilities of each ``continuation`` after its ``prompt``.

        The prompt and the continuation are tokenised separately and concatenated, as a generator
        conditions its sampled tokens on the prompt's tokens.
        """
        ...


@runtime_checkable
class Tokenized(Protocol):
    """A backend that exposes its tokenizer, so step boundaries map to token offsets (the sampler
    records them; the scorer splits log-probs by them). HTTP backends do not: their steps come from
    the text alone."""

    tokenizer: Any


@runtime_checkable
class TokenIdScorer(Tokenized, Scorer, Protocol):
    """A scorer that takes token ids: the prompt and each step are tokenised separately and scored in
    one forward pass, the step offsets being the cumulative token counts (the transformers backend)."""

    def encode_prompt(self, prompt: str) -> list[int]:
        """The prompt's token ids as this backend encodes prompts for generation."""
        ...

    def score_ids(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[ScoredText]:
        """Per-token log-probabilities of each continuation's ids after its prompt's ids."""
        ...
