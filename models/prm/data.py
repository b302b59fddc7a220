"""PRM examples and how a solution becomes tokens with a step tag after every step.

UnPRM section 5 (after Math-Shepherd): the solution's steps are joined with a *step tag* after each
step; the PRM is trained to predict a label token (``+`` correct, ``-`` wrong) at each tag, and a step's
score is the probability of ``+`` there. Each segment (the prompt, each step, each tag) is tokenized on
its own and the ids are concatenated, so every tag's position is known exactly, whatever the tokenizer
would merge across a boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EncodedSolution", "PRMExample", "encode_solution", "label_token_ids", "prompt_text"]

#: The step tag: a blank line (one token for SmolLM2 and Qwen tokenizers).
STEP_TAG = "\n\n"
#: The label tokens whose logits the step-tag formulation trains (UnPRM: ``+`` / ``-``).
POSITIVE, NEGATIVE = " +", " -"


@dataclass(frozen=True)
class PRMExample:
    """One solution with a label per step (the TRL PRM format: ``prompt``, ``completions``, ``labels``).

    ``soft_labels`` (MC values in [0, 1]) are the targets of soft-label training when given.
    """

    prompt: str
    completions: tuple[str, ...]
    labels: tuple[bool, ...]
    soft_labels: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.labels):
            raise ValueError(f"{len(self.completions)} steps but {len(self.labels)} labels")
        if self.soft_labels is not None and len(self.soft_labels) != len(self.labels):
            raise ValueError(f"{len(self.labels)} labels but {len(self.soft_labels)} soft labels")

    def targets(self, soft: bool) -> tuple[float, ...]:
        """Per-step target probability of "correct": the soft label, else 1.0 / 0.0."""
        if soft and self.soft_labels is not None:
            return tuple(min(1.0, max(0.0, float(v))) for v in self.soft_labels)
        return tuple(1.0 if label else 0.0 for label in self.labels)


@dataclass(frozen=True)
class EncodedSolution:
    input_ids: list[int]
    tag_positions: list[int]  # one per step kept (steps past ``max_length`` are dropped)
    prompt_length: int = 0  # tokens before the first step

    def step_spans(self) -> list[tuple[int, int]]:
        """Each kept step's tokens as a half-open position range (its tag after it excluded)."""
        starts = [self.prompt_length, *(p + 1 for p in self.tag_positions[:-1])]
        return list(zip(starts, self.tag_positions, strict=True))


def prompt_text(problem: str) -> str:
    return f"Question: {problem.strip()}\nAnswer:\n"


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_solution(tokenizer: Any, problem: str, steps: Sequence[str], *, max_length: int = 1024) -> EncodedSolution:
    """Token ids of prompt + (step + tag) for each step, and the position of each tag's last token."""
    ids = _ids(tokenizer, prompt_text(problem))
    prompt_length = len(ids)
    tag = _ids(tokenizer, STEP_TAG)
    positions: list[int] = []
    for step in steps:
        segment = _ids(tokenizer, step.strip()) + tag
        if len(ids) + len(segment) > max_length:
            break
        ids.extend(segment)
        positions.append(len(ids) - 1)
    return EncodedSolution(ids, positions, prompt_length)


def label_token_ids(tokenizer: Any) -> tuple[int, int]:
    """The ids of the ``+`` and ``-`` label tokens (the last token of each, should either split)."""
    plus, minus = _ids(tokenizer, POSITIVE)[-1], _ids(tokenizer, NEGATIVE)[-1]
    if plus == minus:
        raise ValueError("the tokenizer maps '+' and '-' to the same token; a step-tag PRM needs two tokens")
    return plus, minus
