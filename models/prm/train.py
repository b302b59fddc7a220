"""Training a PRM with LoRA: the loop, checkpoints that a run resumes from, and the loss curve.

Loss per tag, with target ``y`` (1/0 for hard labels, the MC value for soft ones) and logit ``z``
(:meth:`~prmloop.models.prm.model.PRM.tag_logits`): ``-[y log σ(z) + (1 - y) log(1 - σ(z))]``, averaged
over the batch's tags. For the step-tag formulation ``σ(z_+ - z_-)`` is the two-way softmax of the label
tokens, so this is the cross-entropy over ``{+, -}`` that UnPRM trains; for the head it is the binary
cross-entropy of EpicPRM's classification head.

Checkpoints (every ``checkpoint_every`` steps and at the end) hold the adapter, the head, the optimizer
state, the step, the data order and the random state; :func:`train_prm` resumes from the newest one in
``out_dir/checkpoints``, so an interrupted run continues where it stopped and ends as an uninterrupted
run would.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prmloop.models.prm.data import PRMExample, encode_solution
from prmloop.models.prm.model import PRM, PRMConfig

__all__ = ["TrainResult", "train_prm"]

log = logging.getLogger(__name__)

StepCallback = Callable[[dict[str, float]], None]


@dataclass
class TrainResult:
    artifact_dir: Path
    steps: int
    examples: int
    metrics: dict[str, float]
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def _order(n: int, epochs: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(epochs):
        epoch = list(range(n))
        rng.shuffle(epoch)
        order.extend(epoch)
    return order


def _latest_checkpoint(out_dir: Path) -> Path | None:
    found = sorted((out_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def _save_checkpoint(prm: PRM, optimizer: Any, out_dir: Path, step: int, curve: list[tuple[int, float]]) -> None:
    import torch

    path = out_dir / "checkpoints" / f"step-{step}"
    prm.save(path)
    torch.save(
        {"optimizer": optimizer.state_dict(), "step": step, "torch_rng": torch.get_rng_state(), "curve": curve},
        path / "trainer.pt",
    )
    for old in (out_dir / "checkpoints").glob("step-*"):
        if old != path and int(old.name.split("-")[1]) < step:
            import shutil

            shutil.rmtree(old, ignore_errors=True)


def _write_curve(out_dir: Path, curve: list[tuple[int, float]]) -> None:
    with (out_dir / "loss.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss"])
        writer.writerows(curve)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([s for s, _ in curve], [v for _, v in curve])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    fig.tight_layout()
    fig.savefig(out_dir / "loss.png", dpi=90)
    plt.close(fig)


def train_prm(
    examples: Sequence[PRMExample],
    config: PRMConfig,
    out_dir: Path,
    *,
    prm: PRM | None = None,
    on_step: StepCallback | None = None,
    stop_after: int | None = None,
) -> TrainResult:
    """Train a PRM on ``examples`` into ``out_dir`` (the final PRM in ``out_dir/prm``).

    Args:
        prm: a PRM to train (default: :meth:`PRM.create` from ``config``; a resumed run loads the
            newest checkpoint's adapter into it).
        on_step: called after each optimizer step with ``step``, ``loss``, ``steps_per_s``, ``tokens_per_s``.
        stop_after: stop (with a checkpoint) after this many steps of this call: an interruption, for tests.
    """
    import torch

    if not examples:
        raise ValueError("no training examples: the snapshot has no labelled solutions")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    prm = prm or PRM.create(config)
    soft = config.labels == "soft"
    encoded = []
    for example in examples:
        e = encode_solution(prm.tokenizer, example.prompt, example.completions, max_length=config.max_length)
        if e.tag_positions:
            encoded.append((e, example.targets(soft)[: len(e.tag_positions)]))
    if not encoded:
        raise ValueError(f"no example fits max_length={config.max_length} with even one step")
    order = _order(len(encoded), config.epochs, config.seed)
    total = -(-len(order) // config.batch_size)
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    params = [p for p in prm.model.parameters() if p.requires_grad]
    if prm.head is not None:
        params += list(prm.head.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate)
    step, curve = 0, []
    checkpoint = _latest_checkpoint(out_dir)
    if checkpoint is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(prm.model, load_file(str(checkpoint / "adapter" / "adapter_model.safetensors")))
        if prm.head is not None:
            prm.head.load_state_dict(torch.load(checkpoint / "head.pt", weights_only=True))
        state = torch.load(checkpoint / "trainer.pt", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        step, curve = int(state["step"]), list(state["curve"])
        torch.set_rng_state(state["torch_rng"])
        log.info("resuming from %s (step %d of %d)", checkpoint, step, total)
    prm.model.train()
    started, tokens, done_here = time.perf_counter(), 0, 0
    while step < total:
        rows = [encoded[i] for i in order[step * config.batch_size : (step + 1) * config.batch_size]]
        ids, mask, positions = prm.batch([(e.input_ids, e.tag_positions) for e, _ in rows])
        target = torch.tensor([y for _, ys in rows for y in ys], dtype=torch.float32)
        logits = prm.tag_logits(ids, mask, positions)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        done_here += 1
        tokens += int(mask.sum())
        curve.append((step, float(loss.detach())))
        elapsed = max(time.perf_counter() - started, 1e-9)
        metrics = {
            "step": step,
            "loss": float(loss),
            "steps_per_s": done_here / elapsed,
            "tokens_per_s": tokens / elapsed,
        }
        log.info(
            "step %d/%d loss %.4f (%.2f steps/s, %.0f tokens/s)",
            step,
            total,
            float(loss),
            metrics["steps_per_s"],
            metrics["tokens_per_s"],
        )
        if on_step is not None:
            on_step(metrics)
        if step % config.checkpoint_every == 0 or step == total or (stop_after is not None and done_here >= stop_after):
            _save_checkpoint(prm, optimizer, out_dir, step, curve)
        if stop_after is not None and done_here >= stop_after and step < total:
            break
    elapsed = max(time.perf_counter() - started, 1e-9)
    _write_curve(out_dir, curve)
    final = prm.save(out_dir / "prm") if step >= total else _latest_checkpoint(out_dir) or out_dir
    result_metrics = {
        "final_loss": curve[-1][1] if curve else float("nan"),
        "steps_per_s": done_here / elapsed,
        "tokens_per_s": tokens / elapsed,
        "train_examples": float(len(encoded)),
    }
    (out_dir / "train_metrics.json").write_text(json.dumps({"steps": step, "total_steps": total, **result_metrics}))
    return TrainResult(final, step, len(encoded), result_metrics, curve)
