"""A PRM on a causal language model with LoRA (peft): scoring every step in one forward pass.

Two formulations (:class:`PRMConfig.formulation`):

- ``step_tag`` (UnPRM section 5): the score of step ``t`` is ``softmax(z_+, z_-)[+]`` of the language
  model's logits for the label tokens at the step's tag; training minimises the cross-entropy of those
  two logits against the step's label (hard: 1 or 0; soft: the MC value as the target probability).
  Only the two rows of the output layer are evaluated, never the whole vocabulary.
- ``head`` (EpicPRM 4.3.1, a binary classification head): a linear layer on the last hidden state at
  each tag, ``sigmoid(w·h + b)``, trained with binary cross-entropy. The head is not part of the LoRA
  adapter's weights; :meth:`PRM.save` writes it next to the adapter (``head.pt``) and :meth:`PRM.load`
  reads it back, and a test checks that a reloaded PRM scores exactly as before (the silent bug of an
  adapter saved without its head: a fresh random head after reload).

Because attention is causal, the hidden state at step ``t``'s tag sees only the prompt and steps
``1..t``: one pass over the whole solution gives every step's score, identical to one pass per prefix
(:meth:`PRM.score_prefixes`, the slow baseline ``prmloop bench prm`` compares against).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prmloop.models.prm.data import encode_solution, label_token_ids

__all__ = ["PRM", "PRMConfig"]


class PRMConfig(BaseModel):
    """How a PRM is built and trained (every field's description is its ``--help`` text)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_model: str = Field(default="smollm2", description="'smollm2' (embedded), a local folder or a hub id")
    formulation: Literal["step_tag", "head"] = Field(
        default="step_tag", description="step_tag (UnPRM: +/- token logits at each step tag) or head (linear head)"
    )
    labels: Literal["hard", "soft"] = Field(default="hard", description="hard (0/1) or soft (MC values) targets")
    lora_r: int = Field(default=8, ge=1, description="LoRA rank")
    lora_alpha: int = Field(default=16, ge=1, description="LoRA scaling alpha")
    lora_dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout")
    target_modules: tuple[str, ...] = Field(default=("q_proj", "v_proj"), description="modules LoRA adapts")
    learning_rate: float = Field(default=2e-4, gt=0.0, description="AdamW learning rate")
    epochs: int = Field(default=1, ge=1, description="passes over the training examples")
    max_steps: int | None = Field(default=None, ge=1, description="stop after this many optimizer steps")
    batch_size: int = Field(default=4, ge=1, description="solutions per optimizer step")
    max_length: int = Field(default=768, ge=32, description="tokens per solution; later steps are dropped")
    checkpoint_every: int = Field(default=25, ge=1, description="optimizer steps between checkpoints")
    seed: int = Field(default=0, description="shuffling, dropout and head initialisation seed")
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads")


class PRM:
    """A causal LM with a LoRA adapter (and, for ``head``, a linear head) that scores steps."""

    def __init__(self, model: Any, tokenizer: Any, config: PRMConfig, head: Any | None = None) -> None:
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.plus_id, self.minus_id = label_token_ids(tokenizer)
        if config.formulation == "head" and head is None:
            torch.manual_seed(config.seed)
            head = torch.nn.Linear(self._hidden_size(), 1)
        self.head = head
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def create(cls, config: PRMConfig, *, model: Any | None = None, tokenizer: Any | None = None) -> PRM:
        """A fresh PRM: the base model (loaded unless given) with a new LoRA adapter."""
        from peft import LoraConfig, get_peft_model

        if model is None or tokenizer is None:
            model, tokenizer = _load_base(config)
        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.target_modules),
            bias="none",
        )
        return cls(get_peft_model(model, lora), tokenizer, config)

    @classmethod
    def load(cls, path: Path, *, model: Any | None = None, tokenizer: Any | None = None) -> PRM:
        """A PRM saved by :meth:`save` (the base model is loaded again unless given)."""
        import torch
        from peft import PeftModel

        path = Path(path)
        config = PRMConfig.model_validate_json((path / "prm_config.json").read_text())
        if model is None or tokenizer is None:
            model, tokenizer = _load_base(config)
        peft_model = PeftModel.from_pretrained(model, str(path / "adapter"), is_trainable=False)
        head = None
        if config.formulation == "head":
            state = torch.load(path / "head.pt", map_location="cpu", weights_only=True)
            head = torch.nn.Linear(state["weight"].shape[1], 1)
            head.load_state_dict(state)
        return cls(peft_model, tokenizer, config, head)

    def save(self, path: Path) -> Path:
        """Write the adapter, the head (``head.pt``) and the config; returns ``path``."""
        import torch

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path / "adapter"))
        if self.head is not None:
            torch.save(self.head.state_dict(), path / "head.pt")
        (path / "prm_config.json").write_text(self.config.model_dump_json(indent=2))
        return path

    # -- forward --------------------------------------------------------------------------------------------
    def _hidden_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[1])

    def _backbone(self) -> Any:
        """The decoder without its output layer (LoRA layers are inside it)."""
        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return inner.model

    def _output_rows(self) -> Any:
        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return inner.get_output_embeddings().weight[[self.plus_id, self.minus_id]]

    def batch(self, encoded: Sequence[tuple[list[int], list[int]]]) -> tuple[Any, Any, list[list[int]]]:
        """Right-padded ``input_ids``, ``attention_mask`` and the tag positions per row."""
        import torch

        width = max(len(ids) for ids, _ in encoded)
        ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, (tokens, _) in enumerate(encoded):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        return ids, mask, [list(p) for _, p in encoded]

    def tag_logits(self, input_ids: Any, attention_mask: Any, positions: list[list[int]]) -> Any:
        """One logit per tag (flattened over the batch): ``z_+ - z_-`` (step_tag) or the head's logit.

        ``sigmoid`` of it is the step's score; for ``step_tag`` it equals ``softmax(z_+, z_-)[+]``.
        """
        import torch

        hidden = self._backbone()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        rows = torch.tensor([r for r, p in enumerate(positions) for _ in p], dtype=torch.long)
        cols = torch.tensor([c for p in positions for c in p], dtype=torch.long)
        at_tags = hidden[rows, cols]
        if self.config.formulation == "head":
            assert self.head is not None
            return self.head(at_tags).squeeze(-1)
        two = at_tags @ self._output_rows().T  # (tags, 2): z_+, z_-
        return two[:, 0] - two[:, 1]

    # -- scoring ----------------------------------------------------------------------------------------------
    def score_solutions(
        self, problems: Sequence[str], steps: Sequence[Sequence[str]], *, batch_size: int = 8
    ) -> list[list[float]]:
        """Every step's score (probability the step is correct) of each solution, one pass per solution."""
        import torch

        out: list[list[float]] = []
        self.model.eval()
        with torch.inference_mode():
            for start in range(0, len(problems), batch_size):
                chunk = [
                    encode_solution(self.tokenizer, p, s, max_length=self.config.max_length)
                    for p, s in zip(
                        problems[start : start + batch_size], steps[start : start + batch_size], strict=True
                    )
                ]
                scored = [e for e in chunk if e.tag_positions]
                probs: list[float] = []
                if scored:
                    ids, mask, positions = self.batch([(e.input_ids, e.tag_positions) for e in scored])
                    probs = torch.sigmoid(self.tag_logits(ids, mask, positions)).tolist()
                cursor = 0
                for e in chunk:
                    out.append(probs[cursor : cursor + len(e.tag_positions)])
                    cursor += len(e.tag_positions)
        return out

    def score_prefixes(self, problem: str, steps: Sequence[str]) -> list[float]:
        """The same scores as :meth:`score_solutions`, one forward pass per step prefix (the baseline)."""
        return [self.score_solutions([problem], [list(steps[: t + 1])])[0][-1] for t in range(len(steps))]

    def describe(self) -> dict[str, Any]:
        return {"config": json.loads(self.config.model_dump_json()), "label_tokens": [self.plus_id, self.minus_id]}


def _load_base(config: PRMConfig) -> tuple[Any, Any]:
    from prmloop.models.backends.transformers_backend import TransformersBackend

    # The LoRA PRM builds its batches on the CPU: its base stays there, also where a GPU is present.
    backend = TransformersBackend.from_pretrained(config.base_model, device="cpu", num_threads=config.threads)
    tokenizer = backend.tokenizer
    return backend.model, tokenizer
