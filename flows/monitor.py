"""The Prefect flow ``monitor``: the loop's health as artifacts with stable keys, so each run adds a
version to the same artifact and the UI shows their history.

- ``loop-per-hour`` (table): solutions, labels, judged, accepted and rejected per hour;
- ``loop-summary`` (markdown): acceptance rate, generated tokens per accepted label, the current PRM
  and its metrics, the latest calibration, and a plot of labels per hour;
- ``loop-learning`` (table): per retrain round, the ensemble PRM's held-out F1 next to the accepted
  labels it trained on, the generated tokens spent by then and the solutions the selector skipped.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from prmloop.store.tables.metrics import loop_metrics

__all__ = ["ARTIFACT_KEYS", "CURVE_KEY", "monitor", "publish_curve", "summary_markdown"]

ARTIFACT_KEYS = ("loop-per-hour", "loop-summary", "loop-learning")
#: The streaming loop's learning curve as a picture (``prmloop run`` and the demo publish it).
CURVE_KEY = "loop-learning-curve"


def _plot(per_hour: list[dict[str, Any]]) -> str:
    """A PNG of labels and solutions per hour as a data URI ('' when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ""
    fig, ax = plt.subplots(figsize=(6, 2.6))
    hours = [row["hour"][5:16] for row in per_hour]
    for key in ("solutions", "labels", "accepted"):
        ax.plot(hours, [row[key] for row in per_hour], marker="o", label=key)
    ax.set_ylabel("per hour")
    ax.legend(loc="upper left", fontsize=8)
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _in_force(metrics: dict[str, Any]) -> str:
    """The PRMs in force, whatever their kind: the LoRA PRM and the ensemble PRM the selector uses."""
    lines = []
    for key, kind in (("current_prm", "LoRA PRM"), ("current_prm_ensemble", "ensemble PRM")):
        prm = metrics.get(key)
        if prm:
            found = prm.get("metrics") or {}
            test, val = found.get("test_f1"), found.get("heldout_f1")
            if isinstance(test, float):
                lo, hi = found.get("test_f1_lo", test), found.get("test_f1_hi", test)
                shown = f" (test F1 {test:.3f} [{lo:.3f}, {hi:.3f}])"
            else:
                shown = f" (validation F1 {val:.3f})" if isinstance(val, float) else ""
            lines.append(f"{kind} {prm['model_id']}{shown}")
    return "; ".join(lines) if lines else "none yet"


def summary_markdown(metrics: dict[str, Any]) -> str:
    calibration = metrics["calibration"]
    lines = [
        "## prmloop: the loop",
        "",
        f"- solutions sampled: {metrics['solutions']} ({metrics['sampling_tokens']} tokens)",
        f"- consensus: {metrics['accepted']} accepted, {metrics['rejected']} rejected "
        f"(acceptance rate {_fmt(metrics['acceptance_rate'], '.1%')})",
        "- generated tokens per accepted label (annotation + judging): "
        + _fmt(metrics["tokens_per_accepted_label"], ",.0f"),
        f"- PRM in force: {_in_force(metrics)}",
        f"- calibration: {calibration['calibration_id']} ({calibration['prm']}, {calibration['score_rule']})"
        if calibration
        else "- calibration: none yet",
    ]
    if metrics.get("learning"):
        lines += ["", *learning_table(metrics["learning"])]
    plot = _plot(metrics["per_hour"]) if metrics["per_hour"] else ""
    if plot:
        lines += ["", f"![labels per hour]({plot})"]
    return "\n".join(lines) + "\n"


def learning_table(learning: list[dict[str, Any]]) -> list[str]:
    """The learning curve as markdown table lines: round, labels, tokens, skipped, the test F1 with its
    bootstrap 95 % interval, the validation F1 promotion used, promoted."""
    rows = [
        "| round | accepted labels | trained on | generated tokens | skipped by the PRM | test F1 [95 % CI] "
        "| validation F1 | promoted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in learning:
        test = _fmt(r.get("test_f1"), ".3f")
        if r.get("test_f1_lo") is not None and r.get("test_f1_hi") is not None:
            test += f" [{r['test_f1_lo']:.3f}, {r['test_f1_hi']:.3f}]"
        rows.append(
            f"| {r['round']} | {r['accepted_labels']} | {r['train_solutions']} | {r['generated_tokens']:,} "
            f"| {r['skipped']} | {test} | {_fmt(r['heldout_f1'], '.3f')} | {'yes' if r['promoted'] else 'no'} |"
        )
    return rows


def publish_curve(png: Any, figures: dict[str, Any]) -> None:
    """The learning curve's PNG as the markdown artifact :data:`CURVE_KEY`, with the run's figures."""
    from pathlib import Path

    data = base64.b64encode(Path(png).read_bytes()).decode()
    tested = figures.get("test_curve") or []
    if tested:
        points = ", ".join(
            f"{p['f1']:.3f}"
            + (f" [{p['lo']:.3f}, {p['hi']:.3f}]" if p.get("lo") is not None else "")
            + f" at {p['labels']} labels ({p['at_s'] / 60:.1f} min)"
            for p in tested
        )
    else:
        points = ", ".join(f"{f1:.3f} at {at / 60:.1f} min" for at, f1 in figures.get("f1_curve", []))
    markdown = "\n".join(
        [
            "## the loop learning",
            "",
            f"- accepted labels: {figures.get('accepted_labels')} ({figures.get('accepted_per_minute')} per minute)",
            f"- engine busy after warm-up: {figures.get('engine_busy_fraction')}",
            f"- test F1 [95 % CI] per retrain (the shipped test set; nothing trains or promotes on it): "
            f"{points or 'none'}",
            "",
            f"![learning curve](data:image/png;base64,{data})",
        ]
    )
    create_markdown_artifact(
        key=CURVE_KEY, markdown=markdown, description="test F1 with its 95 % interval after each retrain"
    )


@task(name="loop-metrics")
def metrics_task(db: str) -> dict[str, Any]:
    return loop_metrics(db)


@task(name="publish-artifacts")
def artifacts_task(metrics: dict[str, Any]) -> None:
    create_table_artifact(
        key=ARTIFACT_KEYS[0],
        table=metrics["per_hour"] or [{"hour": "-", "events": 0}],
        description="solutions, labels, judged, accepted and rejected per hour (last 24 hours with events)",
    )
    create_markdown_artifact(
        key=ARTIFACT_KEYS[1], markdown=summary_markdown(metrics), description="the loop at a glance"
    )
    create_table_artifact(
        key=ARTIFACT_KEYS[2],
        table=metrics["learning"] or [{"round": "-", "heldout_f1": None}],
        description="the loop learning: each round's ensemble PRM, held-out F1 against labels and tokens spent",
    )


@task(name="publish-learning-curve")
def curve_task(png: str, figures: dict[str, Any]) -> None:
    publish_curve(png, figures)


@flow(name="monitor")
def monitor(db: str | None = None, curve: str | None = None, figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read the loop's metrics from the store ``db`` (default ``PRMLOOP_STORE``, else the DuckDB file
    in ``PRMLOOP_HOME``) and publish them as artifacts; with ``curve`` (a PNG) also the learning curve
    (:func:`publish_curve`, with the run's ``figures``), inside this flow run."""
    if not db:
        from prmloop.store.settings import StateSettings

        db = str(StateSettings().store_location)
    metrics: dict[str, Any] = metrics_task(db)
    artifacts_task(metrics)
    if curve:
        curve_task(curve, figures or {})
    return metrics
