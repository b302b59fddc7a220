"""``prmloop bench sink`` on both stores, small: every published event is stored once and every
figure is there (the figures themselves are measured by hand, not asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prmloop.flows.lab.bench.sink import bench_sink
from prmloop.flows.lab.bench.sink_lake import bench_sink_lake


def test_the_duckdb_bench_stores_everything_once_and_reports_its_rates() -> None:
    result = bench_sink(n=800, rate=200, latency_seconds=1.0)
    assert result["stored_events"] == result["stored_distinct"] == 800 + result["latency_events_sent"]
    assert result["raw_consume_eps"] > 0 and result["sink_eps"] > 0
    # The ratio is of the unrounded rates; the printed rates are rounded to 0.1 events/s, so their own
    # quotient may differ from it in the third decimal (613.3 / 2970.0 = 0.2065 beside a printed 0.207).
    assert result["sink_to_raw_ratio"] == pytest.approx(result["sink_eps"] / result["raw_consume_eps"], abs=2e-3)
    assert result["latency_events_seen"] == result["latency_events_sent"]


def test_two_lake_sinks_store_everything_once_and_report_rates_and_latency() -> None:
    result = bench_sink_lake(n=800, sinks=2, rate=200, latency_seconds=1.0)
    assert (result["store"], result["sinks"]) == ("ducklake", 2)
    assert result["stored_events"] == result["stored_distinct"] == 800 + result["latency_events_sent"]
    assert result["sink_eps"] > 0 and result["reader_query_p50_ms"] > 0
    assert result["latency_events_seen"] == result["latency_events_sent"] > 0


def test_several_sinks_on_a_duckdb_file_are_refused_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "bench", "sink", "--sinks", "2", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "--store ducklake" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
