"""The loop's CPU figures: each process counted once under its nearest named ancestor, and the engine's
share of what the other processes leave it, after warm-up (issue 55)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prmloop.flows.loop.processes import CpuSample, cpu_by_root, cpu_share, machine_ticks
from prmloop.flows.loop.view import cpu_line


def test_a_process_counts_once_under_its_nearest_named_ancestor() -> None:
    # 10 the driver; 11 a service it started, 12 that service's worker; 13 the driver's grading helper;
    # 20 a process of no one's (another user's), 1 init
    table = {1: (0, 5.0), 10: (1, 30.0), 11: (10, 2.0), 12: (11, 40.0), 13: (10, 3.0), 20: (1, 9.0)}
    assert cpu_by_root({"driver": 10, "engine": 11}, table) == {"driver": 33.0, "engine": 42.0}
    # a named process that is gone gets no entry; its children then count under the next named ancestor
    assert cpu_by_root({"driver": 10, "engine": 99}, table) == {"driver": 75.0}


def test_a_busy_child_counts_under_the_process_that_started_it_unless_it_is_named() -> None:
    spin = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        deadline = time.monotonic() + 50
        while cpu_by_root({"child": busy.pid}).get("child", 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.2)
        unnamed = cpu_by_root({"me": os.getpid()})
        named = cpu_by_root({"me": os.getpid(), "child": busy.pid})
    finally:
        busy.kill()
        busy.wait()
    assert named["child"] >= 0.3
    # unnamed, the child's CPU is its parent's; named, it is its own (and the parent's no longer)
    assert unnamed["me"] - named["me"] >= 0.25
    ticks = machine_ticks()
    assert ticks is not None and ticks[0] > ticks[1] > 0


def _sample(at: float, cpu: tuple[float, float, float], ticks: tuple[int, int]) -> CpuSample:
    return (at, dict(zip(("engine", "driver", "selector"), cpu, strict=True)), ticks)


def test_the_engines_share_is_its_cores_over_what_the_others_left_after_warm_up() -> None:
    samples = [
        _sample(30.0, (50.0, 10.0, 2.0), (1_000, 500)),  # within warm-up: not counted
        _sample(90.0, (100.0, 20.0, 5.0), (13_000, 900)),
        _sample(150.0, (170.0, 28.0, 9.0), (25_000, 1_300)),
        _sample(190.0, (220.0, 33.0, 12.0), (33_000, 1_540)),
    ]
    share = cpu_share(samples, since_s=60.0, cores=2)
    assert share is not None
    # 100 s: the engine 120 CPU-s, the driver 13, the selector 7; the machine 20,000 ticks, 640 of them idle
    assert share["engine"] == pytest.approx(1.2)
    assert share["others"] == pytest.approx(0.2)
    assert share["by_process"] == {"driver": pytest.approx(0.13), "selector": pytest.approx(0.07)}
    assert share["idle"] == pytest.approx(0.064, abs=5e-3)
    assert share["outside"] == pytest.approx(2 - 0.064 - 1.2 - 0.2, abs=1e-2)
    assert share["engine_share_of_left"] == pytest.approx(1.2 / 1.8, abs=1e-3)
    assert (share["from_s"], share["to_s"]) == (90.0, 190.0)
    line = cpu_line(share)
    assert "the engine 1.20" in line and "67 % of what the others left it" in line and "driver 0.13" in line


def test_no_share_without_two_samples_after_warm_up_or_without_an_engine() -> None:
    one = [_sample(90.0, (100.0, 20.0, 5.0), (13_000, 900))]
    assert cpu_share(one, since_s=60.0, cores=2) is None
    no_engine = [(90.0, {"driver": 1.0}, None), (150.0, {"driver": 9.0}, None)]
    assert cpu_share(no_engine, since_s=60.0, cores=2) is None
    # no machine ticks (off Linux): the cores still, no idle
    share = cpu_share([(90.0, {"engine": 1.0}, None), (100.0, {"engine": 11.0}, None)], since_s=0.0, cores=2)
    assert share is not None and share["engine"] == 1.0 and share["idle"] is None
    assert "not measured" in cpu_line(None)


def test_a_long_run_keeps_a_bounded_number_of_cpu_samples_its_first_and_last_among_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows.loop import report
    from prmloop.flows.loop.settings import LoopStatus
    from prmloop.store.settings import StateSettings

    clock = iter(range(10_000))
    monkeypatch.setattr(report, "cpu_by_root", lambda roots: {"engine": float(next(clock)), "driver": 1.0})
    monkeypatch.setattr(report, "machine_ticks", lambda: (1, 0))
    part = report.LoopReport()
    part.state = StateSettings(home=tmp_path)
    part.status = LoopStatus(home=tmp_path)
    for _ in range(1_000):  # a run of 8 hours, one sample every 30 s
        part._sample_rss()
    samples = part.status.cpu_samples
    assert len(samples) <= report.MAX_CPU_SAMPLES
    assert samples[0][1]["engine"] == 0.0 and samples[-1][1]["engine"] == 999.0
    assert [s[1]["engine"] for s in samples] == sorted(s[1]["engine"] for s in samples)
    part.status.stopping = True  # the stop's samples are not the running loop's
    part._sample_rss()
    assert part.status.cpu_samples[-1][1]["engine"] == 999.0
