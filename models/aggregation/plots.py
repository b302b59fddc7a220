"""PNG figures of an aggregation evaluation: accuracy versus N (Kuang et al. Figure 2) and the fitted
weighting functions with their zero crossings (Figures 1 and 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from prmloop.models.aggregation import methods as m
from prmloop.models.aggregation.calibration import AggregationCalibration
from prmloop.models.aggregation.evaluation import AggregationEvaluation
from prmloop.models.aggregation.methods import FloatArray
from prmloop.models.aggregation.selection import METHODS


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def zero_crossings(x: FloatArray, y: FloatArray) -> list[float]:
    """``x`` where ``y`` changes sign (linear interpolation between samples)."""
    out = []
    s = np.sign(y)
    for j in np.flatnonzero(s[:-1] * s[1:] < 0):
        t = y[j] / (y[j] - y[j + 1])
        out.append(float(x[j] + t * (x[j + 1] - x[j])))
    out += [float(v) for v in x[y == 0]]
    return sorted(out)


def plot_accuracy_vs_n(ev: AggregationEvaluation, path: str | Path) -> Path:
    """Mean test accuracy (± std over splits) of every method against the budget ``N`` (log2 axis)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # 13+ methods need distinct colours
    for k in ev.methods:
        mu = 100 * np.asarray(ev.mean(k))
        sd = 100 * np.asarray(ev.std(k))
        bound = METHODS[k].needs_ground_truth
        style = "--" if bound else ("-" if METHODS[k].needs_calibration else ":")
        ax.errorbar(ev.ns, mu, yerr=sd, fmt=style, marker="o", ms=3, capsize=2, label=METHODS[k].label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ev.ns, [str(n) for n in ev.ns])
    ax.set_xlabel("N (candidates per question)")
    ax.set_ylabel("accuracy (%)")
    p = ev.pool
    ax.set_title(f"{p['dataset']} · {p['generator']} · {p['prm_name']} · score {ev.score_rule}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_weighting_functions(fit: AggregationCalibration, path: str | Path) -> Path:
    """The fitted weighting functions over the PRM score in logit space, zero crossings marked.

    Left: the KDE's PRM term ``log f1/f0`` (eq. 2 per class) and the binned calibrator ``g`` that
    estimates ``q_M``; right: ``w_logit(p) = logit(p) - logit(b)``, ``w_linear(p) = p - b`` and the KDE
    PRM term, each crossing zero at a red cross (Kuang et al. Figure 1).
    """
    plt = _pyplot()
    grid = np.asarray(fit.kde.logit_grid)
    ratio = np.asarray(fit.kde.log_density_ratio)
    p = 1.0 / (1.0 + np.exp(-grid))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))

    h1, h0 = fit.kde.bandwidth_correct, fit.kde.bandwidth_incorrect
    ax1.set_title(f"KDE in logit space (h1={h1:.2f}, h0={h0:.2f})")
    twin = ax1.twinx()
    ax1.plot(grid, ratio, color="C2", label="log f1/f0 (PRM term)")
    ax1.axhline(0.0, color="grey", lw=0.8)
    for z in zero_crossings(grid, ratio):
        ax1.plot([z], [0.0], "rx", ms=10, mew=2)
    ax1.set_xlabel("logit(p)")
    ax1.set_ylabel("log density ratio")
    twin.set_ylabel("calibrated P(correct | p)")
    edges = np.asarray(fit.kde.calibrator_edges)
    probs = np.asarray(fit.kde.calibrator_probs)
    bounds = np.concatenate([[grid[0]], m.logit(edges), [grid[-1]]])
    twin.stairs(probs, bounds, color="C1", alpha=0.7, label="binned calibrator g")
    ax1.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)

    w_logit = m.logit_weights(p, fit.logit_b)
    w_linear = m.linear_weights(p, fit.linear_b)
    ax2.set_title(f"weights (logit b={fit.logit_b:.4g}, linear b={fit.linear_b:.4g})")
    ax2.plot(grid, w_logit, label="Logit WV: logit(p) - logit(b)")
    ax2.plot(grid, 10 * w_linear, label="Linear WV: 10 (p - b)")
    ax2.plot(grid, ratio, label="KDE PRM term log f1/f0")
    ax2.axhline(0.0, color="grey", lw=0.8)
    for y in (w_logit, w_linear, ratio):
        for z in zero_crossings(grid, y):
            ax2.plot([z], [0.0], "rx", ms=10, mew=2)
    ax2.set_xlabel("logit(p)")
    ax2.set_ylabel("weight")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{fit.dataset} · {fit.generator} · {fit.prm_name} · score {fit.score_rule} ({fit.score_kind})")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def slug(*parts: str) -> str:
    """A Prefect artifact key / folder name: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def write_outputs(ev: AggregationEvaluation, out_dir: str | Path) -> dict[str, str]:
    """PNG plots, the evaluation JSON and split 0's calibration fit into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "accuracy_png": str(plot_accuracy_vs_n(ev, out / "accuracy_vs_n.png")),
        "weights_png": str(plot_weighting_functions(ev.fits[0], out / "weighting_functions.png")),
    }
    (out / "evaluation.json").write_text(json.dumps(ev.to_dict(), indent=2))
    (out / "calibration_fit.json").write_text(ev.fits[0].model_dump_json(indent=2))
    paths["evaluation_json"] = str(out / "evaluation.json")
    paths["calibration_json"] = str(out / "calibration_fit.json")
    return paths
