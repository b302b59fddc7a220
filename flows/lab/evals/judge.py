"""``prmloop eval judge``: the LLM judge on ProcessBench, scored as the CoT Entropy paper and ProcessBench do.

Per step (``StepwiseJudge.judge_step``): the prediction and every uncertainty estimate on the steps up
to and including the human-labelled first error (all steps of a correct solution), the trace ending at
the first error as in the paper's PRM800K setup. The uncertainties are scored by how well they flag
wrong verifications (:mod:`prmloop.models.judge.metrics`: AUROC, AUPRC, AU-F1C from 30 %,
Rejection-F1 at 60-100 %). Per solution, optionally, the whole-solution critic under the ProcessBench
protocol (:func:`~prmloop.models.processbench.processbench_f1`). Half of the chosen solutions have a
human-labelled error and half have none, so both accuracies exist.

Output: a summary dict (printed as one JSON line by the command), and under ``out_dir`` the summary as
JSON, a markdown table, the per-step rows (JSONL) and the rejection-curve plot (PNG).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from prmloop.consumers.judge import JudgeSettings, critic, stepwise_judge
from prmloop.models.backends.registry import build_backend
from prmloop.models.judge.metrics import error_detection_f1, rejection_curve, uncertainty_auc
from prmloop.models.processbench import ProcessBenchItem, processbench_f1, read_processbench
from prmloop.models.questions import data_dir

__all__ = ["MEASURES", "SERVICE_ONLY", "EvalJudgeSettings", "evaluate_judge"]

#: The uncertainty measures compared (StepVerdict fields; ``predictive`` = epistemic + aleatoric, Eq. 9).
MEASURES = ("cot_entropy", "cot_entropy_discrete", "naive_entropy", "predictive", "epistemic", "aleatoric")
#: Service options that mean nothing for an evaluation.
SERVICE_ONLY = ("group", "topic", "until_idle", "max_solutions", "all_steps")


class EvalJudgeSettings(JudgeSettings):
    """``prmloop eval judge``: the judge's options, the ProcessBench file and the sizes."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_EVAL_JUDGE_", frozen=True, extra="ignore")

    file: Path | None = Field(default=None, description="ProcessBench file (default: processbench/gsm8k.json)")
    limit: int = Field(default=4, ge=2, description="solutions: half with a human-labelled error, half without")
    critic: bool = Field(default=True, description="also run the whole-solution critic (ProcessBench F1)")
    critic_max_new_tokens: int = Field(default=512, ge=1, description="critic: tokens per judgment")
    out_dir: Path = Field(default=Path("out/eval-judge"), description="where the table, rows and plot go")


def _choose(items: list[ProcessBenchItem], limit: int) -> list[ProcessBenchItem]:
    wrong = [i for i in items if i.label >= 0]
    right = [i for i in items if i.label < 0]
    half = limit // 2
    return wrong[:half] + right[: limit - half]


def _measure(row: dict[str, Any], name: str) -> float | None:
    if name == "predictive":
        e, a = row["epistemic"], row["aleatoric"]
        return None if e is None or a is None else e + a
    value = row[name]
    return None if value is None else float(value)


def _plot(curves: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        ax.plot([100 * c for c in curve.coverage], curve.f1, label=name)
    ax.set_xlabel("steps kept, most confident first (%)")
    ax.set_ylabel("error-detection F1 on kept steps")
    ax.set_title("Rejection-F1 of the judge's uncertainty")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def evaluate_judge(
    settings: EvalJudgeSettings, *, progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Judge ``settings.limit`` ProcessBench solutions step by step (and with the critic); score it all."""
    path = settings.file or data_dir() / "processbench" / "gsm8k.json"
    items, _ = read_processbench(path)
    chosen = _choose(items, settings.limit)
    engine = build_backend(settings.backend_config())
    judge = stepwise_judge(settings, engine)
    whole = critic(settings, engine, max_new_tokens=settings.critic_max_new_tokens)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    critic_predictions: list[int | None] = []
    tokens = {"judge": 0, "critic": 0}
    for item in chosen:
        last = item.label if item.label >= 0 else len(item.steps) - 1
        for t in range(last + 1):
            verdict, used = judge.judge_step(item.problem, item.steps, t)
            tokens["judge"] += used
            row = {
                "id": item.key,
                "step": t,
                "has_error": t == item.label,
                "predicted_error": verdict.has_error,
                "p_error": verdict.p_error,
                "cot_entropy": verdict.cot_entropy,
                "cot_entropy_discrete": verdict.cot_entropy_discrete,
                "naive_entropy": verdict.naive_entropy,
                "epistemic": verdict.epistemic,
                "aleatoric": verdict.aleatoric,
                "unparsed_samples": verdict.unparsed,
                "tokens": used,
            }
            rows.append(row)
            if progress is not None:
                progress(row)
        if settings.critic:
            outcome = whole.judge(item.problem, item.steps)
            tokens["critic"] += outcome.generated_tokens
            found = outcome.first_error_step
            critic_predictions.append(-2 if found == "unparsed" else found)
    parsed = [r for r in rows if r["predicted_error"] is not None]
    per_measure: dict[str, dict[str, Any]] = {}
    curves: dict[str, Any] = {}
    for name in MEASURES:
        usable = [r for r in parsed if _measure(r, name) is not None]
        entry: dict[str, Any] = {"steps": len(usable)}
        if usable:
            u = [float(_measure(r, name)) for r in usable]  # type: ignore[arg-type]
            correct = [r["predicted_error"] == r["has_error"] for r in usable]
            auroc, auprc = uncertainty_auc(u, correct)
            curve = rejection_curve(u, [r["predicted_error"] for r in usable], [r["has_error"] for r in usable])
            curves[name] = curve
            entry.update(
                auroc=auroc,
                auprc=auprc,
                au_f1c=round(curve.area(0.3), 4),
                rejection_f1={f"{p}%": round(curve.at(p / 100), 4) for p in (60, 70, 80, 90, 100)},
            )
        per_measure[name] = entry
    critic_scores = processbench_f1(critic_predictions, [i.label for i in chosen]) if settings.critic else None
    summary: dict[str, Any] = {
        "file": str(path),
        "model": engine.model_name,
        "solutions": len(chosen),
        "judged_steps": len(rows),
        "parsed_predictions": len(parsed),
        "step_accuracy": round(sum(r["predicted_error"] == r["has_error"] for r in parsed) / len(parsed), 4)
        if parsed
        else None,
        "step_error_f1": round(
            error_detection_f1([r["predicted_error"] for r in parsed], [r["has_error"] for r in parsed]), 4
        )
        if parsed
        else None,
        "unparsed_sample_rate": round(
            sum(r["unparsed_samples"] for r in rows) / max(1, len(rows) * settings.samples), 4
        ),
        "tokens_per_judged_step": round(tokens["judge"] / len(rows), 1) if rows else None,
        "critic": critic_scores,
        "critic_tokens_per_solution": round(tokens["critic"] / len(chosen), 1) if settings.critic else None,
        "measures": per_measure,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    out = settings.out_dir / path.stem
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["| measure | steps | AUROC | AUPRC | AU-F1C | F1@60% | F1@100% |", "|---|---|---|---|---|---|---|"]
    for name, e in per_measure.items():
        if "auroc" in e:
            fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(
                f"| {name} | {e['steps']} | {fmt(e['auroc'])} | {fmt(e['auprc'])} | {e['au_f1c']:.3f} | "
                f"{e['rejection_f1']['60%']:.3f} | {e['rejection_f1']['100%']:.3f} |"
            )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    files = {"summary": str(out / "summary.json"), "table": str(out / "table.md"), "steps": str(out / "steps.jsonl")}
    if curves:
        files["plot"] = str(_plot(curves, out / "rejection_f1.png"))
    summary["files"] = files
    return summary
