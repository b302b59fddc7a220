"""Specification of the request log and ``prmloop bench replay``'s figures.

The log is written by the real OpenAI-compatible client against a real HTTP server (the tiny model in
this process, :mod:`prmloop.flows.ops.serve`), then replayed against the same server.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from prmloop.flows.lab.bench.replay import gap_factors, loop_figures, per_engine_core, replay, run_cores
from prmloop.models.backends.base import SamplingParams
from prmloop.models.backends.openai_backend import OpenAICompatibleBackend
from prmloop.models.backends.request_log import REQUEST_LOG_VARIABLE, read_requests

SERVED = "tiny-served"
PROMPT = "Step 1: Let x be the number of apples. Step 2:"


def _row(t: float, s: float, tokens: int, n: int = 1) -> dict[str, object]:
    return {"t": t, "s": s, "body": {"prompt": "x", "n": n}, "usage": {"completion_tokens": tokens, "prompt_tokens": 3}}


def test_loop_figures_count_tokens_over_the_span_from_first_request_to_last_answer() -> None:
    # out at 100 (2 s), 101 (4 s, n=4), 103 (1 s): the span is 100..105, 5 s; 10+30+20 = 60 tokens
    rows = [_row(100.0, 2.0, 10), _row(101.0, 4.0, 30, n=4), _row(103.0, 1.0, 20)]
    figures = loop_figures(rows)
    assert figures["span_s"] == 5.0
    assert figures["completion_tokens"] == 60
    assert figures["tokens_per_s"] == 12.0
    assert figures["sequences"] == 6
    assert figures["mean_in_flight"] == 1.4  # (2 + 4 + 1) s of requests over 5 s
    # skipping the first 1 s leaves the requests out at 101 and 103: 101..105, 50 tokens
    skipped = loop_figures(rows, skip_s=1.0)
    assert (skipped["requests"], skipped["span_s"], skipped["tokens_per_s"]) == (2, 4.0, 12.5)
    with pytest.raises(ValueError, match="--skip-s"):
        loop_figures(rows, skip_s=10.0)


def test_an_empty_folder_says_how_to_record_and_a_cut_last_line_is_left_out(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--record-requests"):
        read_requests(tmp_path)
    good = json.dumps(_row(5.0, 1.0, 7))
    (tmp_path / "1.jsonl").write_text(good + "\n" + good.replace("5.0", "4.0") + "\n" + good[:20])
    rows = read_requests(tmp_path)
    assert [row["t"] for row in rows] == [4.0, 5.0]  # oldest first, the cut line dropped
    (tmp_path / "2.jsonl").write_text("not json\n" + good + "\n")
    with pytest.raises(ValueError, match=r"2\.jsonl:1"):
        read_requests(tmp_path)


def test_the_client_records_each_completion_request_without_its_key_and_the_replay_repeats_them(
    tiny_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "requests"
    monkeypatch.setenv(REQUEST_LOG_VARIABLE, str(folder))
    params = SamplingParams(max_new_tokens=6, temperature=0.0, seed=3)
    with OpenAICompatibleBackend(SERVED, base_url=tiny_server_url, api_key="sekret-key", timeout_s=60) as client:
        rollouts = client.rollouts(PROMPT, 3, params)
        sampled = client.generate([PROMPT, "Question: 2 + 2?"], params.model_copy(update={"n": 2}))
    [log] = list(folder.glob("*.jsonl"))
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert "sekret-key" not in log.read_text()
    rows = read_requests(folder)
    assert sorted(row["body"]["n"] for row in rows) == [2, 2, 3]
    generated = sum(c.completion_tokens for c in rollouts) + sum(c.completion_tokens for cs in sampled for c in cs)
    assert sum(row["usage"]["completion_tokens"] for row in rows) == generated
    assert all(row["s"] > 0 for row in rows)

    said: list[str] = []
    replayed = replay(tiny_server_url, [row["body"] for row in rows], 4, said.append, model=SERVED)
    # greedy and seeded: the same requests generate the same tokens again
    assert (replayed["requests"], replayed["errors"], replayed["tokens"]) == (3, 0, generated)
    assert replayed["tokens_per_s"] > 0


def test_a_refused_request_counts_as_an_error_not_as_tokens(tiny_server_url: str) -> None:
    replayed = replay(tiny_server_url, [{"prompt": "x", "max_tokens": 4}], 2, print, model="no-such-model")
    assert (replayed["requests"], replayed["errors"], replayed["tokens"]) == (1, 1, 0)


def test_the_gap_splits_into_the_batch_and_the_rest_whose_product_is_the_ratio() -> None:
    # the engine alone: 54 tokens/s at 64 in flight, 45 at the loop's 9; the loop got 27
    factors = gap_factors(27.0, 54.0, 45.0)
    assert factors == {"batch_factor": 0.833, "contention_factor": 0.6}
    assert factors["batch_factor"] * factors["contention_factor"] == pytest.approx(27.0 / 54.0, abs=1e-3)
    assert gap_factors(27.0, 54.0, 0.0) == {"batch_factor": None, "contention_factor": None}


def test_the_runs_cores_come_from_its_cpu_seconds_over_its_wall_time(tmp_path: Path) -> None:
    run = tmp_path / "last-run.json"
    run.write_text(json.dumps({"wall_s": 400.0, "cpu_s": {"engine": 520.0, "driver": 60.0, "selector": 40.0}}))
    assert run_cores(run) == {"engine": 1.3, "others": 0.25, "after_warm_up": False}
    assert run_cores(tmp_path / "missing.json") is None
    run.write_text(json.dumps({"wall_s": 400.0, "cpu_s": {"driver": 60.0}}))  # transformers: no engine
    assert run_cores(run) is None
    run.write_text("{not json")
    assert run_cores(run) is None


def test_the_runs_cores_after_warm_up_win_over_its_whole_wall_time(tmp_path: Path) -> None:
    run = tmp_path / "last-run.json"
    warm = {"engine": 1.35, "others": 0.49, "idle": 0.07, "engine_share_of_left": 0.894, "from_s": 120.0, "to_s": 360.0}
    run.write_text(json.dumps({"wall_s": 400.0, "cpu_s": {"engine": 440.0, "driver": 60.0}, "cpu_after_warm_up": warm}))
    assert run_cores(run) == warm | {"after_warm_up": True}
    # a run that ended within its warm-up measured none: the whole wall time again
    run.write_text(json.dumps({"wall_s": 400.0, "cpu_s": {"engine": 440.0, "driver": 60.0}, "cpu_after_warm_up": None}))
    assert run_cores(run) == {"engine": 1.1, "others": 0.15, "after_warm_up": False}


def test_tokens_per_engine_core_divides_by_the_cores_the_engine_had() -> None:
    assert per_engine_core(32.4, 1.2) == 27.0
    assert per_engine_core(53.8, 1.96) == 27.4
    assert per_engine_core(30.0, None) is None
    assert per_engine_core(30.0, 0.0) is None
    assert per_engine_core(None, 1.2) is None
