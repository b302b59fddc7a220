"""Scoring with a published PRM that uses the same one-pass trick: Qwen2.5-Math-PRM (7B/72B).

Qwen's PRM reads the chat-formatted solution with the special token ``<extra_0>`` after every step and
outputs two logits per token (``Qwen2ForProcessRewardModel``); the score of step ``t`` is the softmax
probability of class 1 at the ``t``-th ``<extra_0>``. :class:`SeparatorPRM` implements that for any model
with that output (``logits`` of shape ``(batch, tokens, 2)``), so the same code scores the real model on
a GPU (``SeparatorPRM.from_pretrained("Qwen/Qwen2.5-Math-PRM-7B")``, which needs ``trust_remote_code``)
and a tiny model of the same shape in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["QWEN_SEPARATOR", "QWEN_SYSTEM", "SeparatorPRM"]

QWEN_SEPARATOR = "<extra_0>"
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass
class SeparatorPRM:
    model: Any
    tokenizer: Any
    separator: str = QWEN_SEPARATOR
    system: str = QWEN_SYSTEM
    device: str = "cpu"

    @classmethod
    def from_pretrained(cls, name: str, *, device: str = "cuda", dtype: str = "bfloat16") -> SeparatorPRM:
        """Load a published PRM (downloads from the hub: not possible on this machine)."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
        model = AutoModel.from_pretrained(name, dtype=getattr(torch, dtype), trust_remote_code=True).to(device).eval()
        return cls(model, tokenizer, device=device)

    def text(self, problem: str, steps: Sequence[str]) -> str:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": problem},
            {"role": "assistant", "content": self.separator.join(s.strip() for s in steps) + self.separator},
        ]
        if getattr(self.tokenizer, "chat_template", None):
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))
        return f"{self.system}\n{problem}\n" + messages[2]["content"]

    def score_solutions(self, problems: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        """The probability of class 1 at each separator: one score per step, one pass per solution."""
        import torch

        separator_id = self.tokenizer.convert_tokens_to_ids(self.separator)
        out = []
        with torch.inference_mode():
            for problem, solution in zip(problems, steps, strict=True):
                ids = self.tokenizer(self.text(problem, solution), return_tensors="pt").input_ids.to(self.device)
                outputs = self.model(input_ids=ids)
                logits = outputs[0] if isinstance(outputs, tuple) else outputs.logits
                probs = torch.softmax(logits.float(), dim=-1)[0, :, 1]
                out.append(probs[ids[0] == separator_id].tolist())
        return out
