"""What a run of the streaming loop measured: each process's memory and CPU, sampled as it runs, and
the run's figures (:meth:`LoopReport.result`) that the view's summary, the demo, the bench and the
soak report."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from prmloop.flows.loop.processes import cpu_by_root, cpu_share, machine_ticks, rss_mib, rss_summary
from prmloop.flows.loop.watch import OVERLAP_WIDTHS_S, paced_width

if TYPE_CHECKING:
    from pathlib import Path

    from prmloop.flows.loop.settings import LoopSettings, LoopStatus
    from prmloop.flows.loop.watch import EngineMeter, EventWatch
    from prmloop.store.settings import StateSettings

__all__ = ["MAX_CPU_SAMPLES", "LoopReport"]

#: CPU samples a run keeps (one every 30 s: 4 hours before the first thinning)
MAX_CPU_SAMPLES = 480


class LoopReport:
    """The measuring half of :class:`~prmloop.flows.loop.driver.Loop` (which it is mixed into)."""

    s: LoopSettings
    home: Path
    state: StateSettings
    status: LoopStatus
    meter: EngineMeter | None
    watch: EventWatch | None

    def _sample_rss(self) -> None:
        """Every process's memory and CPU (one read of ``/proc`` for the CPU), and the machine's ticks;
        samples taken while the run stops are not CPU samples (the services idle then)."""
        from prmloop.flows.ops.services import running_services

        at = self.status.elapsed()
        roots = {name: record.pid for name, record in running_services(self.state).items()}
        for name, pid in roots.items():
            rss = rss_mib(pid)
            if rss is not None:
                self.status.rss.setdefault(name, []).append((round(at, 1), rss))
        own = rss_mib(os.getpid(), descendants=False)  # the services it started are counted on their own
        if own is not None:
            self.status.rss.setdefault("driver", []).append((round(at, 1), own))
        # the driver's own children (the grading helper) count as the driver's; the services as themselves
        cpu = cpu_by_root({**roots, "driver": os.getpid()})
        self.status.cpu_s.update(cpu)
        if not self.status.stopping:
            samples = self.status.cpu_samples
            samples.append((round(at, 1), cpu, machine_ticks()))
            if len(samples) > MAX_CPU_SAMPLES:  # a run of weeks: every other one goes, the first and last stay
                del samples[1:-1:2]

    # -- results -------------------------------------------------------------------------------------
    def per_window(self, levels: list[Any], wall: float, window_s: float = 600.0) -> list[dict[str, Any]]:
        """Every 10 minutes (the last one may be partial): accepted labels per level, and the test F1 per
        level of the last retrain that landed in it, so a user sees the loop leave the levels that
        stopped teaching."""
        out = []
        for index in range(int(wall // window_s) + (wall % window_s > 0)):
            landed = [
                r
                for r in self.status.retrains
                if r.f1 is not None and index * window_s <= r.at_s < (index + 1) * window_s
            ]
            last = landed[-1] if landed else None
            counts = levels[index] if index < len(levels) else {}
            out.append(
                {
                    "from_min": round(index * window_s / 60),
                    "accepted_by_level": dict(sorted(counts.items())),
                    "test_f1": None if last is None else round(last.f1 or 0.0, 4),
                    "test_f1_by_level": {} if last is None else {k: round(v[0], 4) for k, v in last.by_level.items()},
                }
            )
        return out

    def result(self, warm_up_s: float = 60.0) -> dict[str, Any]:
        """The run in figures: what the bench, the demo's summary and the soak report. The engine's busy
        fraction "after warm-up" counts from ``warm_up_s`` after the first feed began."""
        wall = self.status.elapsed()
        totals = self.watch.snapshot() if self.watch else None
        accepted = totals.accepted if totals else 0
        tokens = totals.generated_tokens if totals else 0
        engine_tokens = self.meter.generated_tokens() if self.meter else None
        trained = [r for r in self.status.retrains if r.f1 is not None]
        warm = (self.status.first_feed_at or 0.0) + warm_up_s
        return {
            "engine": self.status.engine,
            "wall_s": round(wall, 1),
            "accepted_labels": accepted,
            "accepted_with_error": totals.accepted_errors if totals else 0,
            "rejected_labels": totals.counts["LabelsRejected"] if totals else 0,
            "mc_labels": totals.counts["StepsLabeled"] if totals else 0,
            "solutions": totals.counts["SolutionSampled"] if totals else 0,
            "accepted_per_minute": round(accepted / (wall / 60.0), 3) if wall > 0 else 0.0,
            "generated_tokens": tokens,
            "engine_generated_tokens": engine_tokens,
            "accepted_per_1k_tokens": round(1000.0 * accepted / tokens, 3) if tokens else 0.0,
            "engine_busy_fraction": _round(self.meter.busy_fraction(since_s=warm) if self.meter else None),
            "engine_busy_fraction_all": _round(self.meter.busy_fraction() if self.meter else None),
            "prefix_cache_hit_rate": _round(self.meter.prefix_cache_hit_rate() if self.meter else None),
            "f1_curve": [[round(r.at_s, 1), round(r.f1, 4)] for r in trained if r.f1 is not None],
            # every point on the test set with its bootstrap 95 % interval and per level
            "test_curve": [
                {
                    "at_s": round(r.at_s, 1),
                    "labels": r.accepted,
                    "tokens": r.tokens,
                    "f1": round(r.f1, 4),
                    "lo": r.f1_lo,
                    "hi": r.f1_hi,
                    "by_level": {level: list(v) for level, v in r.by_level.items()},
                    "validation_f1": r.val_f1,
                    "promoted": r.promoted,
                }
                for r in trained
                if r.f1 is not None
            ],
            "retrains": [r.__dict__ for r in self.status.retrains],
            "feeds": self.status.feeds,
            "stage_overlap": round(totals.stage_overlap(), 3) if totals else 0.0,
            # the same in wider buckets, and the width that holds two of the sparsest stage's events
            "stage_overlap_by_width": (
                {f"{w:g}": round(totals.stage_overlap(w), 3) for w in OVERLAP_WIDTHS_S} if totals else {}
            ),
            "stage_overlap_width_s": paced_width(totals.stage_events(), wall) if totals else None,
            "reject_reasons": dict(totals.reject_reasons.most_common(5)) if totals else {},
            "rss_mib": self.status.rss,
            "rss_summary": rss_summary(self.status.rss),
            "cpu_s": dict(self.status.cpu_s),
            # cores after warm-up: the engine's, the other processes', the machine's idle, and the engine's
            # share of what the others left it (issue 55's third target)
            "cpu_after_warm_up": cpu_share(self.status.cpu_samples, since_s=warm, cores=os.cpu_count() or 1),
            "accepted_per_10_min": (totals.accepted_windows[: int(wall // 600)] if totals else []),
            "per_10_min": self.per_window(totals.accepted_levels if totals else [], wall),
            "errors": [self.status.last_error] if self.status.last_error else [],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
