"""The round-based loop: the demo's shape before the loop streamed, kept as the comparison arm of
``prmloop bench loop --real`` (run by :mod:`prmloop.flows.lab.bench.rounds_arm`): the settings, the plan
of a round, how it is sized, and its stages.

Each stage is a real run of a service or flow on the demo's broker and store. A round is the loop
once: **prioritize** new questions (two probes each) and **sample** the top of the queue, **score**
the steps, **select** (the promoted ensemble PRM decides which solutions are worth their labels; none
promoted yet: all of them), **annotate** with MC rollouts, **judge** (the curriculum's exact step
checker by default), **consensus**, and **retrain** the ensemble PRM on the accepted labels, scored on
a held-out set of curriculum solutions with known first errors (reference solutions of questions the
loop never samples, and copies with one result changed): the round's held-out F1 is the loop's
learning curve.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from prmloop.store.tables.duck import QueryError, StoreLocked, query

__all__ = [
    "FINAL_RESERVE_S",
    "MIN_ROUND_TOKENS",
    "ROUND_OVERHEAD_S",
    "DemoSettings",
    "RoundPlan",
    "Stages",
    "plan_round",
    "wait_stored",
]

Report = Callable[[str, str], None]

#: Seconds a round costs besides generation on this 2-core machine: five consumer-group joins and idle
#: waits, the ensemble's retrain and its held-out scoring, the store catching up (measured: 60-90 s).
ROUND_OVERHEAD_S = 75.0
#: Seconds kept for what follows the rounds: the calibration, the monitor's artifacts, the summary.
FINAL_RESERVE_S = 60.0
#: Tokens a curriculum solution and an MC label cost on average (level 1, SmolLM2; measured).
TOKENS_PER_SOLUTION = 70
TOKENS_PER_LABEL = 500
#: Solutions a question costs in a round: two probes (prioritizing) and ``k = 4`` samples.
SOLUTIONS_PER_QUESTION = 2 + 4
#: The tokens of the smallest round: one question at 40 % of the round's tokens.
MIN_ROUND_TOKENS = SOLUTIONS_PER_QUESTION * TOKENS_PER_SOLUTION / 0.4
#: The held-out set of every round's PRM (free to make; sampling the model's own would cost minutes).
EVAL_SET = "arith-reference"
#: The consumer group of the demo's free labels (correct solutions, no rollouts).
FREE_LABELS_GROUP = "prmloop-annotator-free"


@dataclass(frozen=True)
class DemoSettings:
    home: Path | None = None
    minutes: float = 15.0
    threads: int | None = None
    level: int = 1
    #: Levels taken in turn, one per round (the bench's rounds arm samples the streaming arms' levels).
    levels: tuple[int, ...] = ()
    seed: int = 0
    judge: Literal["exact", "critic", "stepwise"] = "exact"
    rounds: int = 3
    #: auto: the machine's vLLM engine where ``make vllm`` made it ready, else transformers in process.
    engine: Literal["auto", "transformers", "vllm"] = "auto"

    def level_of(self, index: int) -> int:
        """The curriculum level round ``index`` (from 0) samples."""
        return self.levels[index % len(self.levels)] if self.levels else self.level


@dataclass(frozen=True)
class RoundPlan:
    """One round's sizes: questions sampled from the queue (``k`` each), incorrect solutions annotated."""

    questions: int
    k: int
    annotate: int
    max_new_tokens: int = 192
    rollout_tokens: int = 128

    def describe(self) -> str:
        return f"sample {self.questions} questions x {self.k}, annotate up to {self.annotate} incorrect solutions"


def plan_round(
    tokens_per_s: float,
    seconds_left: float,
    rounds_left: int,
    *,
    overhead_s: float = ROUND_OVERHEAD_S,
    reserve_s: float = FINAL_RESERVE_S,
) -> RoundPlan | None:
    """The next round's sizes: this round's share of the time left (less the final reserve and the
    rounds' fixed ``overhead_s``) as tokens at the speed measured so far, 40 % prioritizing and sampling
    (two probes and four samples a question) and 60 % MC labels. Where the ``rounds_left`` rounds leave
    no round a question, fewer and larger ones are planned (the later ones are cut).
    ``None``: not even one question fits in one round (the round is cut)."""
    for rounds in range(max(1, rounds_left), 0, -1):
        spare = seconds_left - reserve_s - rounds * overhead_s
        tokens = max(0.0, tokens_per_s) * max(0.0, spare) / rounds
        questions = min(6, int(0.4 * tokens / (SOLUTIONS_PER_QUESTION * TOKENS_PER_SOLUTION)))
        if questions >= 1:
            annotate = max(1, min(6, int(0.6 * tokens / TOKENS_PER_LABEL)))
            return RoundPlan(questions=questions, k=4, annotate=annotate)
    return None


def count(db: Path, sql: str) -> int:
    try:
        return int(query(db, sql, timeout_s=5).rows[0][0] or 0)
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


class StateRollouts(NamedTuple):
    """MC rollouts a state: N0, N_min, N_max, and a state's N_max when none of its rollouts is correct."""

    n0: int
    n_min: int
    n_max: int
    state_n_max: int


def _loop_rollouts() -> StateRollouts:
    """The streaming loop's rollouts a state (``LoopSettings`` owns them)."""
    from prmloop.flows.loop.settings import LoopSettings

    loop = LoopSettings()
    return StateRollouts(n0=loop.n0, n_min=loop.n_min, n_max=loop.n_max, state_n_max=loop.state_n_max)


@dataclass
class Stages:
    """The demo's stages on one broker and store; ``left()`` is the budget's time left in seconds."""

    settings: DemoSettings
    servers: str
    db: Path
    home: Path
    report: Report
    stored: Callable[[], int]
    left: Callable[[], float]
    in_flight: int = 1  # solutions the annotator keeps going at once
    #: MC rollouts a state (the streaming loop's, so the bench compares like with like)
    rollouts: StateRollouts = field(default_factory=_loop_rollouts)
    eval_questions: int = 8
    eval_set: str = EVAL_SET
    #: seconds without input after which a stage's service stops (the round's drain)
    idle_s: float = 3.0
    #: a round's fixed seconds, and the seconds kept after the last round (see :func:`plan_round`)
    overhead_s: float = ROUND_OVERHEAD_S
    reserve_s: float = FINAL_RESERVE_S

    def heldout(self) -> int:
        """The held-out set: reference solutions and corrupted copies of questions the loop never samples."""
        from prmloop.flows.retrain_ensemble import EVAL_SEED, eval_items

        items = eval_items(self.eval_set, limit=self.eval_questions)
        errors = sum(i.first_error >= 0 for i in items)
        self.report(
            "held-out",
            f"{len(items)} curriculum solutions with known first errors ({len(items) - errors} reference solutions, "
            f"{errors} with one result changed; levels 1-3, seed {EVAL_SEED}: questions the loop never samples)",
        )
        return len(items)

    def prioritize(self, questions: int, *, index: int) -> dict[str, Any]:
        """Probe ``questions`` new curriculum questions (seed ``settings.seed + index``: each round its own)
        with two samples each, and queue them by priority; the probes' solutions are labelled like any."""
        from prmloop.flows.prioritize import run_prioritize
        from prmloop.producers.prioritize import PrioritizeSettings

        s = self.settings
        settings = PrioritizeSettings(
            dataset="arith",
            level=s.level_of(index),
            limit=questions,
            k=2,
            round=0,
            seed=s.seed + index,
            max_new_tokens=192,
            threads=s.threads,
        )
        out = run_prioritize(settings, bootstrap_servers=self.servers)
        self.report(
            f"round {index + 1}",
            f"prioritized {out['questions']} new questions ({out['probe_tokens']} probe tokens): {out['hopeless']} "
            f"all wrong, {out['trivial']} all right",
        )
        wait_stored(self.stored)
        return out

    def round(self, index: int, rounds: int, plan: RoundPlan) -> dict[str, Any]:
        """One turn of the loop; returns what each stage did and the generation it cost."""
        from prmloop.consumers.annotator import AnnotatorSettings, run_annotator
        from prmloop.consumers.consensus import ConsensusSettings, run_consensus
        from prmloop.consumers.judge import JudgeSettings, run_judge
        from prmloop.consumers.scorer import ScorerSettings, run_scorer
        from prmloop.consumers.selector import SelectorSettings, run_selector
        from prmloop.flows.sample import run_sample
        from prmloop.producers.sampler import SampleSettings
        from prmloop.store.settings import StateSettings

        s, name = self.settings, f"round {index + 1}/{rounds}"
        outbox = StateSettings().outbox_dir
        tick = time.monotonic()
        probed = self.prioritize(plan.questions + 2, index=index)
        sampled = run_sample(
            SampleSettings(
                from_queue=True,
                db=str(self.db),
                limit=plan.questions,
                k=plan.k,
                m=plan.k,
                n=plan.k,
                max_new_tokens=plan.max_new_tokens,
                seed=s.seed,
                threads=s.threads,
            ),
            bootstrap_servers=self.servers,
        )
        sample_s = time.monotonic() - tick
        self.report(
            name,
            f"sampled the top {sampled['questions']} of the queue: {sampled['solutions']} solutions "
            f"({sampled['correct']} correct, {sampled['incorrect']} incorrect, {sampled['completion_tokens']} tokens)",
        )
        scored = run_scorer(
            ScorerSettings(until_idle=self.idle_s), bootstrap_servers=self.servers, install_signal_handlers=False
        )
        selected = run_selector(
            SelectorSettings(db=str(self.db), until_idle=self.idle_s, refresh_s=0.01),
            bootstrap_servers=self.servers,
            install_signal_handlers=False,
        )
        prm = "no ensemble PRM yet" if index == 0 else "the promoted ensemble PRM"
        self.report(
            name,
            f"scored {scored['published']}; selector ({prm}): {selected['label']} to label, {selected['skip']} skipped",
        )
        tick = time.monotonic()
        reserve = self.reserve_s + (rounds - index - 1) * self.overhead_s + min(30.0, self.overhead_s)
        annotating = AnnotatorSettings(
            strategy="adaptive_binary",
            n0=self.rollouts.n0,
            n_min=self.rollouts.n_min,
            n_max=self.rollouts.n_max,
            state_n_max=self.rollouts.state_n_max,
            max_new_tokens=plan.rollout_tokens,
            until_idle=self.idle_s + 2,
            max_solutions=plan.annotate,
            in_flight=self.in_flight,
            threads=s.threads,
        )
        # Every correct solution's label first, in a group of its own: they cost no rollout, and the
        # capped search below would reach only those that share a batch with the solutions it takes.
        # The same settings give the same event ids, so a label both passes publish is stored once.
        free = run_annotator(
            annotating.model_copy(update={"free_only": True, "group": FREE_LABELS_GROUP, "max_solutions": None}),
            bootstrap_servers=self.servers,
            outbox_dir=outbox,
            install_signal_handlers=False,
        )
        labelled = run_annotator(
            annotating,
            bootstrap_servers=self.servers,
            outbox_dir=outbox,
            until=lambda: self.left() < reserve,
            install_signal_handlers=False,
        )
        annotate_s = time.monotonic() - tick
        cut = " (cut: the budget's time for this round ran out)" if self.left() < reserve else ""
        judged = run_judge(
            JudgeSettings(method=s.judge, samples=4, max_new_tokens=256, until_idle=self.idle_s, threads=s.threads),
            bootstrap_servers=self.servers,
            install_signal_handlers=False,
        )
        decided = run_consensus(
            ConsensusSettings(until_idle=self.idle_s),
            bootstrap_servers=self.servers,
            outbox_dir=outbox,
            install_signal_handlers=False,
        )
        self.report(
            name,
            f"MC: {labelled['labelled']} first errors, {free['all_correct']} correct solutions labelled (free), "
            f"{labelled['unresolved']} unresolved ({labelled['rollouts']} rollouts, {labelled['generated_tokens']} "
            f"tokens){cut}; judge ({s.judge}): {judged.get('judged')}; consensus: {decided.get('accepted')} accepted, "
            f"{decided.get('rejected')} rejected",
        )
        wait_stored(self.stored)
        retrained = self.retrain(name)
        return {
            "sample": {k: sampled[k] for k in ("questions", "solutions", "correct", "incorrect", "completion_tokens")},
            "select": {"label": selected["label"], "skip": selected["skip"]},
            "annotate": {
                **{k: labelled.get(k) for k in ("labelled", "unresolved", "generated_tokens")},
                "all_correct": free["all_correct"],
            },
            "consensus": {k: decided.get(k) for k in ("accepted", "rejected", "waiting")},
            "retrain": retrained,
            "generated_tokens": int(probed["probe_tokens"])
            + int(sampled["completion_tokens"])
            + int(labelled["generated_tokens"]),
            "generation_s": sample_s + annotate_s,
            "cut": bool(cut),
        }

    def retrain(self, name: str) -> dict[str, Any]:
        """The ensemble PRM on every accepted label so far, scored on the held-out set, registered."""
        from prmloop.flows.retrain import run_retrain

        accepted = count(self.db, "SELECT count(*) FROM consensus WHERE decision = 'accepted'")
        if accepted < 1:
            self.report(name, "retrain: no accepted label yet, no PRM this round")
            return {"trained": False, "accepted": 0}
        summary = run_retrain(
            db=str(self.db),
            kind="accepted",
            prm_kind="ensemble",
            eval_set=self.eval_set,
            eval_limit=self.eval_questions,
            out_dir=str(self.home / "prm"),
            min_examples=1,
            ratios=(1.0, 0.0, 0.0),
            bootstrap_servers=self.servers,
        )
        if not summary.get("trained"):
            self.report(name, f"retrain: not trained ({summary.get('reason')})")
            return {"trained": False, "accepted": accepted}
        metrics = summary["metrics"]
        self.report(
            name,
            f"retrain: ensemble PRM {summary['model_id']} on {int(metrics['train_solutions'])} accepted solutions in "
            f"{metrics['train_seconds']:.1f}s: held-out F1 {metrics['heldout_f1']:.3f}; {summary['decision']}",
        )
        wait_stored(self.stored)
        return {k: summary[k] for k in ("model_id", "promoted", "metrics", "artifact")}

    def calibrate(self) -> dict[str, Any]:
        """Fit the aggregation calibration on the shared GSM8K Best-of-N pool (a published PRM's scores)."""
        from prmloop.flows.calibrate import calibrate
        from prmloop.models.questions import data_dir
        from prmloop.store.events import CalibrationFitted, make_event
        from prmloop.store.kafka.producer import EventProducer

        pool = data_dir() / "bon" / "gsm8k_candidates.jsonl.gz"
        if not pool.is_file():
            self.report("calibrate", f"skipped: {pool} not found (../shared must sit beside the clone)")
            return {"skipped": True}
        result = calibrate(str(pool), subsamples=10, splits=2, out_dir=str(self.home / "calibration"))
        payload = CalibrationFitted.model_validate(result["event_payload"])
        with EventProducer(self.servers) as producer:
            producer.publish([make_event(payload, producer="prmloop-demo/0.3.0")])
        self.report(
            "calibrate", f"aggregation calibrated on {pool.name} (qwen_prm scores); CalibrationFitted published"
        )
        return {"calibration_id": payload.calibration_id}
