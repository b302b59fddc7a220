"""What a user watches while ``prmloop run`` (and the demo) streams: a live panel on a terminal, a
progress line every half minute elsewhere (logs, CI, a pipe), and the learning curve at the end.

The panel: time, engine (its busy fraction over the last minute from its own gauge, and its
generation rate), labels (accepted per minute over the last five minutes and overall, MC labels,
rejections), the backlog that paces the sampler, and each retrain's test F1 with its bootstrap 95 %
interval as it lands (the shipped test set nothing trains or promotes on), with the PRM in force.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from prmloop.flows.loop.processes import cpu_share

if TYPE_CHECKING:
    from prmloop.flows.loop.driver import Loop
    from prmloop.flows.loop.settings import Retrain

__all__ = ["LoopView", "cpu_line", "curve_lines", "curve_png", "progress_line"]


def _per_minute(times: list[float], now: float, window_s: float) -> float:
    recent = [t for t in times if t >= now - window_s]
    span = min(window_s, max(now, 1e-6))
    return 60.0 * len(recent) / span


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _model(model_id: str | None) -> str:
    return (model_id or "-")[:8]


def snapshot(loop: Loop) -> dict[str, Any]:
    """The figures the panel and the progress line show, read once per refresh."""
    status = loop.status
    now = status.elapsed()
    totals = loop.watch.snapshot() if loop.watch else None
    meter = loop.meter
    recent = totals.recent_accepted if totals else []
    return {
        "elapsed": now,
        "minutes": loop.s.minutes,
        "engine": status.engine,
        "busy_recent": meter.busy_fraction(since_s=now - 60.0) if meter else None,
        "busy": meter.busy_fraction(since_s=min(60.0, now / 2)) if meter else None,
        "tokens_per_s": meter.rate(30.0) if meter else None,
        # the engine's cores over the last minute's CPU samples, and its share of what the others left
        "cpu_recent": cpu_share(list(status.cpu_samples), since_s=now - 65.0, cores=os.cpu_count() or 1),
        "accepted": totals.accepted if totals else 0,
        "accepted_errors": totals.accepted_errors if totals else 0,
        "per_minute_recent": _per_minute(recent, now, 300.0),
        "per_minute": 60.0 * (totals.accepted if totals else 0) / max(now, 1e-6),
        "rejected": totals.counts["LabelsRejected"] if totals else 0,
        "mc": totals.counts["StepsLabeled"] if totals else 0,
        "solutions": totals.counts["SolutionSampled"] if totals else 0,
        "correct": totals.correct_solutions if totals else 0,
        "tokens": totals.generated_tokens if totals else 0,
        "waiting": status.waiting,
        "queue": status.queue,
        "feeds": status.feeds,
        "retrains": list(status.retrains),
        "retraining": status.retraining,
        "prm": status.prm,
        "calibrations": status.calibrations,
        "error": status.last_error,
        "stopping": status.stopping,
    }


def progress_line(s: dict[str, Any]) -> str:
    """One line of the figures, for logs and terminals without a panel."""
    scored = [r for r in s["retrains"] if r.f1 is not None]
    curve = ", ".join(r.f1_text() for r in scored[-4:]) or "none yet"
    if len(scored) > 4:
        curve = f"... {curve}"
    return (
        f"[{s['elapsed']:5.0f}s] accepted {s['accepted']} ({s['per_minute']:.1f}/min), rejected {s['rejected']}, "
        f"MC {s['mc']}; solutions {s['solutions']} ({s['correct']} correct), {s['tokens']:,} tokens; "
        f"engine busy {_pct(s['busy_recent'])}{_cores(s['cpu_recent'])}; waiting {s['waiting']}; "
        f"test F1 [95 % CI] per retrain: {curve}"
    )


def _cores(share: dict[str, Any] | None) -> str:
    """`` (1.42 cores, 96 % of what the rest left)``, or nothing before two CPU samples."""
    if not share or share["engine_share_of_left"] is None:
        return ""
    return f" ({share['engine']:.2f} cores, {100 * share['engine_share_of_left']:.0f} % of what the rest left)"


def render(s: dict[str, Any]) -> Group:
    budget = f" of {s['minutes']:g} min" if s["minutes"] else " (Ctrl-C stops)"
    head = Text(f"prmloop run: {s['elapsed'] / 60:.1f} min{budget}", style="bold")
    if s["stopping"]:
        head.append("  stopping: finishing the work in flight", style="yellow")
    figures = Table.grid(padding=(0, 2))
    figures.add_column(style="dim")
    figures.add_column()
    rate = f", {s['tokens_per_s']:.0f} tokens/s" if s["tokens_per_s"] is not None else ""
    figures.add_row(
        "engine", f"{s['engine']}: busy {_pct(s['busy_recent'])}{_cores(s['cpu_recent'])} (last minute){rate}"
    )
    figures.add_row(
        "labels",
        f"{s['accepted']} accepted ({s['accepted_errors']} with a first error), {s['per_minute_recent']:.1f}/min "
        f"(last 5 min), {s['per_minute']:.1f}/min overall; {s['rejected']} rejected; {s['mc']} MC labels",
    )
    figures.add_row(
        "sampling",
        f"{s['solutions']} solutions ({s['correct']} correct), {s['tokens']:,} generated tokens; {s['feeds']} feeds",
    )
    figures.add_row("backlog", f"{s['waiting']} solutions waiting for the annotator; {s['queue']} questions queued")
    prm = Path(s["prm"]).name if s["prm"] else "none promoted yet"
    figures.add_row("PRM in force", f"ensemble {prm}" + ("; retraining..." if s["retraining"] else ""))
    if s["error"]:
        figures.add_row("last error", Text(s["error"][:160], style="red"))
    curve = Table("retrain", "at", "labels", "test F1 [95 % CI]", "by level", "promoted", box=None, padding=(0, 1))
    for i, r in enumerate(s["retrains"][-12:], start=max(1, len(s["retrains"]) - 11)):
        f1 = r.f1_text() if r.f1 is not None else f"- ({r.reason})"
        curve.add_row(str(i), f"{r.at_s:.0f}s", str(r.accepted), f1, _levels(r), "yes" if r.promoted else "no")
    return Group(head, figures, curve if s["retrains"] else Text("retrains: none yet", style="dim"))


class LoopView:
    """A live panel on a terminal (``live``), else a progress line every ``every_s`` seconds."""

    def __init__(self, loop: Loop, out: IO[str], *, live: bool | None = None, every_s: float = 30.0) -> None:
        self.loop = loop
        self.out = out
        self.console = Console(file=out, highlight=False)
        self.live_enabled = self.console.is_terminal if live is None else live
        self.every_s = every_s
        self._live: Live | None = None
        self._last = 0.0

    def __enter__(self) -> LoopView:
        if self.live_enabled:
            self._live = Live(render(snapshot(self.loop)), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(render(snapshot(self.loop)))
            self._live.__exit__(None, None, None)
            self._live = None
        else:
            self.out.write(progress_line(snapshot(self.loop)) + "\n")

    def tick(self) -> None:
        figures = snapshot(self.loop)
        if self._live is not None:
            self._live.update(render(figures))
            return
        if time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            self.out.write(progress_line(figures) + "\n")
            self.out.flush()


def _levels(r: Retrain) -> str:
    """The test F1 per level, compactly: ``L1 .91 L2 .84 ...``."""
    return " ".join(f"{level} {f1:.2f}".replace("0.", ".") for level, (f1, _lo, _hi) in r.by_level.items())


def curve_lines(retrains: list[Retrain]) -> list[str]:
    """The learning curve as a terminal table: one row per retrain, test F1 with its 95 % interval."""
    lines = ["  retrain   at (s)   accepted labels   test F1 [95 % CI]       promoted   test F1 by level"]
    for i, r in enumerate(retrains, start=1):
        f1 = r.f1_text() if r.f1 is not None else "-"
        lines.append(
            f"  {i:7d} {r.at_s:8.0f} {r.accepted:17d}   {f1:<22}  {'yes' if r.promoted else 'no':<9}  {_levels(r)}"
        )
    return lines


def cpu_line(share: dict[str, Any] | None) -> str:
    """The cores after warm-up in one sentence (``cpu_after_warm_up`` of the run's figures)."""
    if not share:
        return "CPU after warm-up: not measured (the run ended within its warm-up, or no engine ran)"
    top = ", ".join(f"{name} {cores:.2f}" for name, cores in list(share["by_process"].items())[:4])
    idle = "" if share["idle"] is None else f"; idle {share['idle']:.2f}, outside the loop {share['outside']:.2f}"
    left = share["engine_share_of_left"]
    return (
        f"CPU after warm-up ({share['from_s']:.0f}-{share['to_s']:.0f} s, {share['cores']} cores): the engine "
        f"{share['engine']:.2f}, the loop's other processes {share['others']:.2f} ({top}){idle}; the engine had "
        + ("no core left" if left is None else f"{100 * left:.0f} % of what the others left it")
    )


def curve_png(retrains: list[Retrain], path: Path) -> Path | None:
    """The learning curve as a PNG (None without matplotlib): test F1 with its 95 % interval as a band,
    against accepted labels (with the F1 per level as thin lines) and against minutes; promoted models
    filled. No per-point labels: they overlapped once retrains came every half minute."""
    points = [r for r in retrains if r.f1 is not None]
    if not points:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (by_labels, by_time) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    banded = [r for r in points if r.f1_lo is not None and r.f1_hi is not None]
    for ax, x_of, label in (
        (by_labels, lambda r: r.accepted, "accepted labels trained on"),
        (by_time, lambda r: r.at_s / 60.0, "minutes into the run"),
    ):
        if banded:
            ax.fill_between(
                [x_of(r) for r in banded],
                [r.f1_lo for r in banded],
                [r.f1_hi for r in banded],
                alpha=0.25,
                color="tab:blue",
                linewidth=0,
                label="95 % interval",
            )
        ax.plot([x_of(r) for r in points], [r.f1 for r in points], color="tab:blue", linewidth=1.5, label="test F1")
        promoted = [r for r in points if r.promoted]
        ax.scatter(
            [x_of(r) for r in promoted], [r.f1 for r in promoted], color="tab:blue", s=14, zorder=3, label="promoted"
        )
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    levels = sorted({level for r in points for level in r.by_level})
    palette = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray")
    for index, level in enumerate(levels):
        shown = [r for r in points if level in r.by_level]
        by_labels.plot(
            [r.accepted for r in shown],
            [r.by_level[level][0] for r in shown],
            linewidth=0.8,
            linestyle="--",
            color=palette[index % len(palette)],
            label=f"{level} test F1",
        )
    if len(points) > 1 and points[-1].accepted > 8 * max(points[0].accepted, 1):
        by_labels.set_xscale("log")
    by_labels.set_ylabel("test F1")
    by_labels.set_ylim(0, 1)
    by_labels.legend(fontsize=6, ncol=2, loc="lower right")
    fig.suptitle(
        "the loop learning: each retrain's ensemble PRM on the test set (nothing trains or promotes on it)", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
