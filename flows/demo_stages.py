"""The stages of ``prmloop demo`` (see :mod:`prmloop.flows.demo`): each one a real run of a service or
flow on the demo's broker and store, sized by the demo's plan, skipped with a message when the time
budget or its inputs are missing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prmloop.store.duck import QueryError, StoreLocked, query
from prmloop.store.events import CalibrationFitted, make_event

if TYPE_CHECKING:
    from prmloop.flows.demo import DemoPlan, DemoSettings

__all__ = ["run_stages", "wait_stored"]

Report = Callable[[str, str], None]


def _count(db: Path, sql: str) -> int:
    try:
        return int(query(db, sql, timeout_s=5).rows[0][0])
    except (StoreLocked, FileNotFoundError, QueryError):
        return 0


def wait_stored(stored: Callable[[], int], *, settle_s: float = 2.0, timeout_s: float = 120.0) -> int:
    """Wait until the store's event count stops growing for ``settle_s`` (the sink has caught up)."""
    deadline = time.monotonic() + timeout_s
    last, since = stored(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = stored()
        if now != last:
            last, since = now, time.monotonic()
        elif now >= 0 and time.monotonic() - since >= settle_s:
            break
    return last


def _prioritize(
    plan: DemoPlan, s: DemoSettings, servers: str, *, round: int, limit: int, prm: Any = None
) -> dict[str, Any]:
    from prmloop.flows.prioritize import run_prioritize
    from prmloop.producers.prioritize import PrioritizeSettings

    settings = PrioritizeSettings(
        dataset="arith",
        level=s.level,
        limit=limit,
        k=plan.probe_k,
        round=round,
        seed=s.seed,
        max_new_tokens=plan.max_new_tokens,
        threads=s.threads,
    )
    return run_prioritize(settings, bootstrap_servers=servers, prm=prm)


def run_stages(
    plan: DemoPlan, s: DemoSettings, *, servers: str, db: Path, report: Report, stored: Callable[[], int]
) -> dict[str, Any]:
    """Run every stage in order; returns each stage's summary."""
    from prmloop.consumers.annotator import AnnotatorSettings, run_annotator
    from prmloop.consumers.consensus import ConsensusSettings, run_consensus
    from prmloop.consumers.judge import JudgeSettings, run_judge
    from prmloop.consumers.scorer import ScorerSettings, run_scorer
    from prmloop.flows.sample import run_sample
    from prmloop.producers.sampler import SampleSettings
    from prmloop.store.settings import StateSettings

    deadline = time.monotonic() + s.minutes * 60.0
    outbox = StateSettings().outbox_dir
    out: dict[str, Any] = {}

    def left() -> float:
        return deadline - time.monotonic()

    first = _prioritize(plan, s, servers, round=0, limit=plan.questions)
    out["prioritize"] = {k: first[k] for k in ("questions", "probe_tokens", "hopeless", "trivial")}
    report(
        "prioritize",
        f"probed {first['questions']} questions ({first['probe_tokens']} tokens): "
        f"{first['hopeless']} all wrong, {first['trivial']} all right; the queue is in questions.prioritized",
    )
    wait_stored(stored)
    queued = _count(db, "SELECT count(*) FROM question_priorities")
    sampled = run_sample(
        SampleSettings(
            from_queue=True,
            db=db,
            limit=plan.sample_questions,
            k=plan.k,
            m=1,
            n=plan.k - 1,
            max_new_tokens=plan.max_new_tokens,
            seed=s.seed,
            threads=s.threads,
        ),
        bootstrap_servers=servers,
    )
    out["sample"] = {k: sampled[k] for k in ("questions", "solutions", "correct", "incorrect", "completion_tokens")}
    report(
        "sample",
        f"took the top {sampled['questions']} of {queued} queued questions: {sampled['solutions']} "
        f"solutions, {sampled['correct']} correct, {sampled['incorrect']} incorrect",
    )
    scored = run_scorer(ScorerSettings(until_idle=5), bootstrap_servers=servers, install_signal_handlers=False)
    out["score"] = {"published": scored["published"]}
    report("score", f"step uncertainty of {scored['published']} solutions (probes and samples)")
    if left() > 60:
        annotator = AnnotatorSettings(
            strategy="adaptive_binary",
            n0=4,
            n_min=2,
            n_max=8,
            max_new_tokens=plan.rollout_tokens,
            until_idle=10,
            max_solutions=plan.annotate,
            threads=s.threads,
        )
        labelled = run_annotator(annotator, bootstrap_servers=servers, outbox_dir=outbox, install_signal_handlers=False)
        out["annotate"] = {
            k: labelled.get(k) for k in ("labelled", "all_correct", "unresolved", "rollouts", "generated_tokens")
        }
        report(
            "annotate",
            f"{labelled['labelled']} first errors found, {labelled['all_correct']} correct solutions "
            f"labelled, {labelled['unresolved']} unresolved (no rollout reached the answer); "
            f"{labelled['rollouts']} rollouts, {labelled['generated_tokens']} tokens",
        )
    else:
        report("annotate", "skipped: the time budget is spent")
    if left() > 30 or s.judge == "exact":
        judge = JudgeSettings(
            method=s.judge,
            samples=4,
            max_new_tokens=256,
            until_idle=10,
            max_solutions=None if s.judge == "exact" else plan.judge,
            threads=s.threads,
        )
        judged = run_judge(judge, bootstrap_servers=servers, install_signal_handlers=False)
        out["judge"] = {k: judged.get(k) for k in ("judged", "unparsed", "generated_tokens")}
        what = {
            "exact": "the curriculum's exact step checker",
            "critic": "the critic (whole solution, ProcessBench protocol)",
            "stepwise": "the step-wise LLM judge with CoT Entropy",
        }[s.judge]
        report(
            "judge", f"{what} judged {judged.get('judged')} solutions ({judged.get('unparsed', 0)} without a verdict)"
        )
    else:
        report("judge", "skipped: the time budget is spent")
    consensus = run_consensus(
        ConsensusSettings(until_idle=5), bootstrap_servers=servers, outbox_dir=outbox, install_signal_handlers=False
    )
    out["consensus"] = {k: consensus.get(k) for k in ("accepted", "rejected", "waiting")}
    report(
        "consensus",
        f"{consensus.get('accepted')} accepted, {consensus.get('rejected')} rejected, "
        f"{consensus.get('waiting')} waiting for their other half",
    )
    wait_stored(stored)
    out["train"] = _train(db, report, left(), s.threads, servers)
    out["calibrate"] = _calibrate(servers, report, left())
    if left() > 60:
        prm = None
        if out["train"].get("artifact"):
            from prmloop.models.prm.model import PRM

            prm = PRM.load(Path(out["train"]["artifact"]))
        again = _prioritize(plan, s, servers, round=1, limit=min(plan.questions, 4), prm=prm)
        out["prioritize_again"] = {k: again[k] for k in ("questions", "probe_tokens")}
        with_prm = " with the new PRM's score spread" if prm else ""
        report("prioritize", f"round 1: {again['questions']} questions re-probed{with_prm}")
    else:
        report("prioritize", "round 1 skipped: the time budget is spent")
    out["events"] = wait_stored(stored)
    report("store", f"{out['events']} events in {db}")
    from prmloop.flows.monitor import ARTIFACT_KEYS, monitor

    metrics = monitor(str(db))
    out["acceptance_rate"] = metrics["acceptance_rate"]
    report("monitor", f"artifacts {', '.join(ARTIFACT_KEYS)} published (acceptance rate {metrics['acceptance_rate']})")
    return out


def _train(db: Path, report: Report, seconds_left: float, threads: int | None, servers: str) -> dict[str, Any]:
    """Snapshot, train a LoRA PRM for a few steps, evaluate on a few ProcessBench solutions, register.

    Consensus-accepted labels when there are any, else the MC labels (the laptop loop makes few: a PRM
    trained on a handful of solutions shows the pipeline working, not a useful model)."""
    from prmloop.flows.retrain import run_retrain
    from prmloop.models.prm.model import PRMConfig

    accepted = _count(db, "SELECT count(*) FROM consensus WHERE decision = 'accepted'")
    labelled = _count(db, "SELECT count(DISTINCT solution_id) FROM label_history WHERE source = 'StepsLabeled'")
    kind = "accepted" if accepted >= 1 else "mc"
    if seconds_left < 90 or (accepted if kind == "accepted" else labelled) < 1:
        report("train", f"skipped: {accepted} accepted and {labelled} MC-labelled solutions, {seconds_left:.0f}s left")
        return {"trained": False, "accepted_labels": accepted}
    config = PRMConfig(max_steps=6, batch_size=2, max_length=512, learning_rate=5e-4, threads=threads)
    summary = run_retrain(
        db=str(db),
        kind=kind,
        out_dir=str(db.parent / "prm"),
        config=config,
        eval_limit=4,
        min_examples=1,
        ratios=(1.0, 0.0, 0.0),
        bootstrap_servers=servers,
    )
    if not summary.get("trained"):
        report("train", f"not trained: {summary.get('reason')}")
        return summary
    report(
        "train",
        f"PRM {summary['model_id']} trained on the {kind} labels (6 LoRA steps), ProcessBench F1 gsm8k "
        f"{summary['metrics']['processbench_gsm8k_f1']:.2f} on 4 solutions; {summary['decision']}",
    )
    return {k: summary[k] for k in ("model_id", "artifact", "promoted", "metrics")}


def _calibrate(servers: str, report: Report, seconds_left: float) -> dict[str, Any]:
    """Fit the aggregation calibration on the shared GSM8K Best-of-N pool (a published PRM's scores)."""
    if seconds_left < 45:
        report("calibrate", "skipped: the time budget is spent")
        return {"skipped": True}
    from prmloop.flows.calibrate import calibrate
    from prmloop.models.questions import data_dir
    from prmloop.store.kafka import EventProducer

    pool = data_dir() / "bon" / "gsm8k_candidates.jsonl.gz"
    if not pool.is_file():
        report("calibrate", f"skipped: {pool} not found (the shared data folder)")
        return {"skipped": True}
    result = calibrate(str(pool), subsamples=10, splits=2, out_dir=str(Path("out") / "demo-calibration"))
    payload = CalibrationFitted.model_validate(result["event_payload"])
    with EventProducer(servers) as producer:
        producer.publish([make_event(payload, producer="prmloop-demo/0.2.0")])
    report("calibrate", f"aggregation calibrated on {pool.name} (qwen_prm scores); CalibrationFitted published")
    return {"calibration_id": payload.calibration_id}
