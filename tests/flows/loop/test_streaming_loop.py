"""The streaming loop's parts that need no running stack: its settings, the question stream, where a
later run goes on, the engine meter's busy fraction, the overlap measure, and what the view prints."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.loop.driver import Loop, LoopSettings, QuestionStream, Retrain, sampled_indices
from prmloop.flows.loop.view import LoopView, curve_lines, curve_png, progress_line, snapshot
from prmloop.flows.loop.watch import METER_BUCKET_S as BUCKET_S
from prmloop.flows.loop.watch import EngineMeter, overlap
from prmloop.producers.arith import arith_question
from prmloop.producers.events import question_registered
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore


def test_levels_are_read_from_a_list_and_refused_outside_the_curriculum() -> None:
    assert LoopSettings(levels="2, 1").level_list == (2, 1)
    assert LoopSettings(levels=(1, 3)).levels == "1,3"
    for wrong in ("0", "1,6", "", "one"):
        with pytest.raises(ValidationError, match="levels must be curriculum levels 1-5"):
            LoopSettings(levels=wrong)


def test_the_annotator_the_loop_starts_takes_its_rollout_counts_and_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from prmloop.consumers.annotator_settings import AnnotatorSettings
    from prmloop.models.annotation.estimate import Sampling

    for n0, n_min, n_max, state_n_max in ((2, 1, 4, 4), (3, 0, 3, 0), (16, 10, 72, 8)):
        loop = LoopSettings(n0=n0, n_min=n_min, n_max=n_max, state_n_max=state_n_max)
        for key, value in loop.service_environment().items():
            monkeypatch.setenv(key, value)
        strategy = AnnotatorSettings().make_strategy()
        assert strategy.sampling == Sampling(n0=n0, n_min_correct=n_min, n_max=n_max)  # type: ignore[attr-defined]
        assert strategy.state_n_max == (state_n_max or None)  # type: ignore[attr-defined]
    assert LoopSettings().state_n_max == 4  # the loop tops up a state none of whose 2 rollouts solved it
    with pytest.raises(ValidationError, match=r"n0 \(5\) must not exceed n_max \(4\)"):
        LoopSettings(n0=5, n_max=4)
    for in_flight, batch, taken in ((4, None, 12), (12, 12, 12), (12, 36, 36)):
        for key, value in LoopSettings(in_flight=in_flight, annotate_batch=batch).service_environment().items():
            monkeypatch.setenv(key, value)
        assert (AnnotatorSettings().in_flight, AnnotatorSettings().taken_at_once) == (in_flight, taken)
    with pytest.raises(ValidationError, match=r"annotate_batch \(3\) must be at least in_flight \(4\)"):
        LoopSettings(in_flight=4, annotate_batch=3)


def test_the_stream_takes_the_levels_in_turn_and_never_repeats_a_question() -> None:
    stream = QuestionStream((1, 2), seed=0, start={2: 5})
    ids = [q.id for q in stream.take(4)] + [q.id for q in stream.take(2)]
    assert ids == ["arith/L1/0/0", "arith/L2/0/5", "arith/L1/0/1", "arith/L2/0/6", "arith/L1/0/2", "arith/L2/0/7"]
    assert len(set(ids)) == len(ids)


def test_a_later_run_goes_on_after_the_questions_the_store_has_seen(tmp_path: Path) -> None:
    from prmloop.models.arith import generate_question

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    questions = [arith_question(generate_question(level, 0, i)) for level, i in ((1, 0), (1, 3), (2, 1))]
    questions.append(arith_question(generate_question(1, 7, 9)))  # another seed: not this run's
    events = [question_registered(q, producer="test") for q in questions]
    store.write_batch(
        events_to_arrow([ConsumedEvent(e, "questions.registered", 0, i, 0) for i, e in enumerate(events)]),
        [("questions.registered", 0, len(events))],
    )
    assert sampled_indices(store.location, 0) == {1: 4, 2: 2}
    assert sampled_indices(tmp_path / "none.duckdb", 0) == {}


def test_the_engine_is_busy_in_the_samples_where_requests_ran() -> None:
    meter = EngineMeter("http://127.0.0.1:1/v1")
    # 4 samples in the first bucket, 2 busy; 2 in the second, both busy; then 2 idle in the third
    for at, running in ((0.0, 1), (1.0, 0), (2.0, 2), (3.0, 0), (BUCKET_S, 1), (BUCKET_S + 1, 3)):
        meter.record(at, {"requests_running": float(running), "generation_tokens": 10.0 * at})
    meter.record(2 * BUCKET_S, {"requests_running": 0.0, "generation_tokens": 100.0})
    meter.record(2 * BUCKET_S + 1, {"requests_running": 0.0, "generation_tokens": 100.0})
    assert meter.busy_fraction() == pytest.approx(4 / 8)
    assert meter.busy_fraction(since_s=BUCKET_S) == pytest.approx(2 / 4)
    assert meter.busy_fraction(since_s=BUCKET_S, until_s=BUCKET_S + 1) == pytest.approx(1.0)
    assert meter.busy_fraction(since_s=100.0) is None
    assert meter.generated_tokens() == 100
    # over the last 6 s: from the sample at 5 s (50 tokens) to 11 s (100 tokens)
    assert meter.rate(6.0) == pytest.approx((100.0 - 50.0) / (2 * BUCKET_S + 1 - BUCKET_S))


def test_overlap_is_the_share_of_active_time_in_which_every_stage_produced() -> None:
    together = {0: {"sample", "annotate", "consensus"}, 1: {"sample", "annotate", "consensus", "score"}}
    rounds = {0: {"sample"}, 1: {"annotate"}, 2: {"consensus"}, 3: set()}
    assert overlap(together) == 1.0
    assert overlap(rounds) == 0.0
    assert overlap({**together, 2: {"sample"}}) == pytest.approx(2 / 3)
    assert overlap({}) == 0.0


def test_the_curve_is_a_table_and_a_picture_with_intervals_and_levels(tmp_path: Path) -> None:
    retrains = [
        Retrain(50.0, 8, 0.25, True, "m1", 5.0, f1_lo=0.2, f1_hi=0.3, by_level={"L1": (0.4, 0.3, 0.5)}),
        Retrain(120.0, 20, None, False, None, 1.0, reason="0 training solutions"),
        Retrain(200.0, 31, 0.5, True, "m2", 6.0, f1_lo=0.45, f1_hi=0.55, by_level={"L1": (0.6, 0.5, 0.7)}),
    ]
    lines = curve_lines(retrains)
    assert len(lines) == 4 and "0.250 [0.200, 0.300]" in lines[1] and "0.500 [0.450, 0.550]" in lines[3]
    assert " - " in lines[2] and "L1 .60" in lines[3]
    png = curve_png(retrains, tmp_path / "curve.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert curve_png(retrains[1:2], tmp_path / "none.png") is None


def test_a_retrains_point_is_its_test_f1_with_interval_and_levels() -> None:
    from prmloop.flows.loop.settings import retrain_of
    from prmloop.flows.retrain_ensemble import test_metrics

    metrics = {
        "heldout_f1": 0.9,
        **test_metrics(
            {
                "all": {"f1": 0.7, "lo": 0.65, "hi": 0.75, "n": 1600},
                "L1": {"f1": 0.8, "lo": 0.7, "hi": 0.9, "n": 400},
                "L5": {"f1": None, "lo": None, "hi": None, "n": 100},
            }
        ),
    }
    assert metrics["test_f1"] == 0.7 and metrics["test_solutions"] == 1600.0 and "test_f1_L5" not in metrics
    summary = {"metrics": metrics, "promoted": True, "model_id": "m"}
    point = retrain_of(summary, at_s=10.0, accepted=5, wall_s=1.0, tokens=99)
    assert (point.f1, point.f1_lo, point.f1_hi, point.val_f1) == (0.7, 0.65, 0.75, 0.9)
    assert point.by_level == {"L1": (0.8, 0.7, 0.9)} and point.f1_text() == "0.700 [0.650, 0.750]"
    before = {"metrics": {"heldout_f1": 0.5}, "promoted": False, "model_id": None}
    old = retrain_of(before, at_s=1.0, accepted=1, wall_s=1.0, tokens=0)
    assert old.f1 == 0.5 and old.f1_lo is None and old.f1_text() == "0.500"  # a store from before the test set


def test_without_a_terminal_the_view_prints_a_line_every_half_minute(tmp_path: Path) -> None:
    loop = Loop(LoopSettings(minutes=1), home=tmp_path)
    loop.status.retrains.append(Retrain(30.0, 9, 0.4, True, "m", 2.0, f1_lo=0.35, f1_hi=0.45))
    out = io.StringIO()
    with LoopView(loop, out, live=False, every_s=30.0) as view:
        view.tick()
        view.tick()  # within the half minute: nothing more
    lines = out.getvalue().splitlines()
    shown = "test F1 [95 % CI] per retrain: 0.400 [0.350, 0.450]"
    assert len(lines) == 2 and all("accepted 0" in line and shown in line for line in lines)
    assert progress_line(snapshot(loop)).startswith("[")
    assert "cores" not in lines[0]  # no CPU samples yet: no share shown
    # two CPU samples in the last minute: the engine 1.2 cores, the others 0.4 (on 2 cores: 75 % of what they left)
    now = loop.status.elapsed()
    loop.status.cpu_samples += [
        (now - 40.0, {"engine": 10.0, "driver": 1.0}, None),
        (now - 10.0, {"engine": 46.0, "driver": 13.0}, None),
    ]
    share = 100 * 1.2 / ((os.cpu_count() or 1) - 0.4)
    assert f"engine busy n/a (1.20 cores, {share:.0f} % of what the rest left)" in progress_line(snapshot(loop))


def test_the_watch_counts_labels_and_stages_as_they_arrive(kafka_bootstrap: str) -> None:
    from prmloop.flows.lab.bench.synthetic import synthetic_events
    from prmloop.flows.loop.watch import BUCKET_S, RECENT_S, EventWatch
    from prmloop.store.events.codec import decode_event, encode_event

    events = synthetic_events(60, k=2, seed=5)
    by_type: dict[str, list[bytes]] = {}
    for event in events:
        by_type.setdefault(event.event_type, []).append(encode_event(event))
    watch = EventWatch(kafka_bootstrap)  # not started: the records are handed to it
    sampled, labeled = by_type["SolutionSampled"], by_type["StepsLabeled"]
    accepted = by_type.get("LabelsAccepted", [])
    assert len(accepted) >= 2, "the synthetic stream has accepted labels"
    # bucket 0: every stage of the overlap; bucket 1: sampling only; bucket 2 (11 minutes in): labels only
    watch.count(sampled[:2] + labeled[:1] + accepted[:1], now=1.0)
    watch.count(sampled[2:3], now=BUCKET_S + 1)
    watch.count(labeled[1:2] + accepted[1:2], now=RECENT_S + 60)
    totals = watch.snapshot()
    assert totals.counts["SolutionSampled"] == 3 and totals.accepted == 2
    assert totals.stage_overlap() == pytest.approx(1 / 3)
    # 60 s buckets put the sampling at 31 s into bucket 0 with the rest: 1 of 2
    assert totals.stage_overlap(60.0) == pytest.approx(1 / 2)
    assert totals.stage_events() == {"sample": 3, "annotate": 2, "consensus": 2}
    assert totals.accepted_windows[0] == 1
    assert totals.accepted_windows == [1, 1] and totals.recent_accepted == [RECENT_S + 60]  # the first aged out
    assert totals.sampled_tokens == sum(decode_event(b).payload.completion_tokens for b in sampled[:3])


def test_the_overlap_bucket_follows_the_runs_pace() -> None:
    from prmloop.flows.loop.watch import StageTimeline, paced_width

    # 20 labels in 600 s: 30 s a label, two a minute: 60 s buckets
    assert paced_width({"sample": 80, "annotate": 40, "consensus": 20}, 600.0) == 60.0
    assert paced_width({"sample": 80, "annotate": 40, "consensus": 40}, 600.0) == 30.0
    assert paced_width({"sample": 80, "annotate": 40, "consensus": 5}, 600.0) == 240.0
    assert paced_width({"sample": 80, "annotate": 40, "consensus": 4}, 600.0) is None
    assert paced_width({"sample": 80, "annotate": 0, "consensus": 40}, 600.0) is None
    # stage after stage in 100 s rounds: 0 in 60 s buckets; streaming: every bucket
    rounds, stream = StageTimeline(60.0), StageTimeline(60.0)
    for start in range(0, 600, 100):
        for offset, stage in ((0, "sample"), (40, "annotate"), (80, "consensus")):
            rounds.add(start + offset, stage)
    for at in range(0, 600, 10):
        stream.add(at, ("sample", "annotate", "consensus")[at // 10 % 3])
    assert rounds.overlap() == 0.0 and stream.overlap() == 1.0
    assert StageTimeline(30.0).overlap() == 0.0


def test_a_failed_feed_is_tried_again_later_with_the_same_questions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from prmloop.flows import feed

    calls: list[list[str]] = []

    def failing(probe: list, top_up: list, settings: object, **kwargs: object) -> dict:
        calls.append([q.id for q in probe])
        raise ConnectionError("the engine is restarting")

    monkeypatch.setattr(feed, "run_feed", failing)
    loop = Loop(LoopSettings(probe_batch=2), home=tmp_path)
    probe, top_up = loop._next_batch()
    with pytest.raises(ConnectionError):
        loop._feed(probe, top_up)
    assert loop._retry_batches == [(probe, top_up)] and loop._feed_backoff_s == 10.0
    assert loop._feed_retry_at > time.monotonic() + 5
    loop._maybe_feed()  # too early: nothing starts
    assert not loop._busy("feed") and len(calls) == 1
    with pytest.raises(ConnectionError):
        loop._feed(*loop._retry_batches.pop(0))
    assert loop._feed_backoff_s == 20.0 and calls[0] == calls[1]  # the same questions, backing off
    assert loop.status.feeds_running == 0


def _let_feeds_finish(loop: Loop, release: threading.Event) -> None:
    release.set()
    for thread in loop._threads:
        thread.join(10)


def test_feeds_overlap_up_to_their_number_and_the_backlog_counts_the_ones_still_sampling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows import feed

    release = threading.Event()
    started: list[list[str]] = []

    def slow(probe: list, top_up: list, settings: object, **kwargs: object) -> dict:
        started.append([q.id for q in probe])
        release.wait(30)
        return {"probed": [], "solutions": 18}

    monkeypatch.setattr(feed, "run_feed", slow)
    loop = Loop(LoopSettings(feeds=2, probe_batch=6, probe_k=2, top_up_batch=3, k=4, ahead=48), home=tmp_path)
    assert loop.feed_size() == 18  # 6 probed x 2 + 3 topped up x (4 - 2)
    waiting = {"n": 0}
    monkeypatch.setattr(loop, "waiting", lambda: waiting["n"])
    loop.status.engine = "vllm"  # in process (transformers) one feed at a time: it runs the model itself
    try:
        for _ in range(3):
            loop._maybe_feed()
        deadline = time.monotonic() + 10
        while len(started) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(started) == 2 and loop.status.feeds_running == 2  # the third waits for a place
        assert set(started[0]).isdisjoint(started[1])  # each feed its own new questions
    finally:
        _let_feeds_finish(loop, release)
    assert loop.status.feeds_running == 0 and loop.status.published == 36 and loop.status.feeds == 2

    # one feed still sampling counts as its 18 solutions: 30 waiting + 18 reach --ahead 48, so no second
    release.clear()
    waiting["n"] = 30
    try:
        loop._maybe_feed()
        loop._maybe_feed()
        assert loop.unfinished().count("feed") == 1
        waiting["n"] = 29
        loop._maybe_feed()
        assert loop.unfinished().count("feed") == 2
    finally:
        _let_feeds_finish(loop, release)

    release.clear()
    waiting["n"] = 0
    loop.status.engine = "transformers"
    try:
        loop._maybe_feed()
        loop._maybe_feed()
        assert loop.unfinished().count("feed") == 1
    finally:
        _let_feeds_finish(loop, release)


def test_the_feeds_reach_the_engine_as_the_services_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prmloop.flows.feed import FeedSettings
    from prmloop.flows.loop.feeding import sampling_engine
    from prmloop.flows.ops.engine import service_environment

    for key, value in service_environment("http://127.0.0.1:1/v1", tmp_path).items():
        monkeypatch.setenv(key, value)
    settings = FeedSettings(**sampling_engine())
    assert (settings.backend, settings.base_url) == ("openai", "http://127.0.0.1:1/v1")
    assert settings.api_key is not None and settings.api_key.get_secret_value()  # the engine refuses requests without
    assert settings.backend_config().options["api_key"] == settings.api_key.get_secret_value()


def test_until_retrains_stops_the_loop_once_that_many_retrains_have_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = Loop(LoopSettings(until_retrains=2, minutes=5), home=tmp_path)
    for name in ("_maybe_feed", "_maybe_retrain", "_sample_rss"):
        monkeypatch.setattr(loop, name, lambda *args: None)
    landed = [
        Retrain(10.0, 3, None, False, None, 1.0, "too few labels"),  # did not score: does not count
        Retrain(20.0, 5, 0.41, True, "a", 1.0),
        Retrain(30.0, 8, 0.52, True, "b", 1.0),
        Retrain(40.0, 9, 0.55, True, "c", 1.0),
    ]
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(len(loop.status.retrains))
        if landed:
            loop.status.retrains.append(landed.pop(0))

    loop.run(on_tick=tick, tick_s=0.0)
    assert loop.scored_retrains() == 2 and ticks == [0, 1, 2]  # the third scored retrain never came


def test_the_pool_sampler_sends_the_running_engines_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prmloop.flows.pools import sampling as active_sampling
    from prmloop.store.auth.credentials import load_credentials

    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path))
    monkeypatch.setattr(active_sampling, "_running_engine", lambda: "http://127.0.0.1:1/v1")
    sampler = active_sampling.Sampler()
    key = load_credentials(tmp_path).engine_api_key
    assert sampler.kind == "vllm" and sampler.api_key == key  # the engine answers 401 without it
    assert sampler.annotator_options()["api_key"] == key


def test_a_retrain_names_the_last_trained_snapshot_so_the_same_labels_train_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows import retrain

    asked: list[object] = []
    answers = [
        {"trained": True, "snapshot": "s1", "metrics": {"heldout_f1": 0.5}, "promoted": True, "model_id": "m1"},
        {"trained": False, "snapshot": {"snapshot_id": "s1"}, "reason": "no new training solution (s1 unchanged)"},
    ]

    def fake(**kwargs: object) -> dict:
        asked.append(kwargs["unless_snapshot"])
        return {**answers[len(asked) - 1], "artifact": str(tmp_path / "prm")}

    monkeypatch.setattr(retrain, "run_retrain", fake)
    monkeypatch.setattr("prmloop.flows.loop.driver.time.sleep", lambda s: None)
    loop = Loop(LoopSettings(), home=tmp_path)
    monkeypatch.setattr(loop, "publish_progress", lambda: None)
    loop._retrain(5)
    loop._retrain(6)
    assert asked == [None, "s1"]
    assert [r.f1 for r in loop.status.retrains] == [0.5, None]  # the second is no point on the curve
    assert loop.scored_retrains() == 1 and "unchanged" in str(loop.status.retrains[1].reason)
