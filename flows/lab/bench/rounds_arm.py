"""The round-based arm of ``prmloop bench loop --real``: today's loop before it streamed, stage after stage.

Each round prioritizes new questions, samples the top of the queue, then runs the scorer, selector,
annotator, judge and consensus one after the other (each drains its topic until a few seconds idle and
stops) and retrains the ensemble PRM (:mod:`prmloop.flows.lab.bench.rounds`). Rounds are sized from the
speed measured so far to fit the wall-clock budget. It runs on the arm's own broker and sink (started
as ``prmloop up`` starts them, in the arm's home) and the engine the bench shares between its arms, and
is measured the same way as the streaming arms (:mod:`prmloop.flows.loop.watch`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prmloop.flows.lab.bench.rounds import MIN_ROUND_TOKENS, DemoSettings, RoundPlan, Stages, plan_round, wait_stored
from prmloop.flows.loop.settings import LoopSettings
from prmloop.flows.loop.watch import EngineMeter, EventWatch
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["OVERTIME_FACTOR", "SMALLEST_ROUND", "next_round", "round_seconds", "run_rounds_arm", "speed_probe"]

#: The round run past the budget for a retrain still owed: one question x 4, one solution annotated.
SMALLEST_ROUND = RoundPlan(questions=1, k=4, annotate=1)
#: How far past its budget an arm owed retrains may run, as a multiple of the budget.
OVERTIME_FACTOR = 4.0


def next_round(
    *,
    tokens_per_s: float,
    left_s: float,
    index: int,
    rounds: int,
    overhead_s: float,
    retrains: int,
    until_retrains: int | None,
    elapsed_s: float,
    budget_s: float,
) -> tuple[RoundPlan | None, bool]:
    """Round ``index``'s plan (``None``: the arm ends) and whether it runs past the budget: the
    :func:`plan_round` of the ``rounds`` while the time left holds one, else :data:`SMALLEST_ROUND`
    while scored retrains are owed (``until_retrains``) and the overtime cap (``OVERTIME_FACTOR`` x
    ``budget_s`` in all) is not reached."""
    if index < rounds:
        plan = plan_round(tokens_per_s, left_s, rounds - index, overhead_s=overhead_s, reserve_s=0.0)
        if plan is not None:
            return plan, False
    owed = until_retrains is not None and retrains < until_retrains
    if owed and elapsed_s < OVERTIME_FACTOR * budget_s:
        return SMALLEST_ROUND, True
    return None, False


def round_seconds(tokens_per_s: float, overhead_s: float) -> float:
    """The time the smallest round needs: its fixed cost twice (the stages' drains, and the reserve the
    annotator's cut keeps) and its tokens at the speed measured so far."""
    return 2 * overhead_s + MIN_ROUND_TOKENS / max(tokens_per_s, 1.0)


def speed_probe(threads: int | None, base_url: str | None = None, api_key: str | None = None) -> float:
    """Tokens per second of the engine the stages will use: transformers in process, or the vLLM
    engine at ``base_url`` (its API key: ``api_key``, else ``$PRMLOOP_HOME``'s credentials'); batched
    like the loop's sampling and rollouts (two prompts x 4)."""
    from prmloop.models.backends.base import SamplingParams
    from prmloop.models.backends.registry import EngineSettings, build_backend

    if base_url is None:
        engine = EngineSettings(threads=threads)
    else:
        from prmloop.flows.ops.engine import SERVED_MODEL_NAME
        from prmloop.store.auth.credentials import load_credentials

        key = api_key or load_credentials().engine_api_key
        engine = EngineSettings(backend="openai", model=SERVED_MODEL_NAME, base_url=base_url, api_key=key)
    generator = build_backend(engine.backend_config())
    generator.generate(["Count: 1,"], SamplingParams(n=1, max_new_tokens=4, temperature=0.7, seed=0))  # warm-up
    started = time.perf_counter()
    batches = generator.generate(
        ["Count: 1, 2, 3,", "Tom has 3 apples and buys 2 more."],
        SamplingParams(n=4, max_new_tokens=24, temperature=0.7, seed=0),
    )
    tokens = sum(c.completion_tokens for batch in batches for c in batch)
    return tokens / max(time.perf_counter() - started, 1e-6)


def run_rounds_arm(
    *,
    home: Path,
    budget_s: float,
    engine_url: str | None,
    levels: tuple[int, ...] = (1,),
    rounds: int = 3,
    eval_set: str = "arith",
    seed: int = 0,
    threads: int | None = None,
    idle_s: float = 3.0,
    until_retrains: int | None = None,
    say: Any = print,
) -> dict[str, Any]:
    """Rounds until ``budget_s`` seconds have passed; the same figures as ``Loop.result``. ``levels``:
    curriculum levels taken in turn, one per round; ``idle_s``: how long each stage's service waits for
    more input before the round moves on. ``until_retrains``: where the budget holds fewer scored
    retrains, the smallest round (:data:`SMALLEST_ROUND`) runs past it until there are that many, for at
    most ``OVERTIME_FACTOR`` times the budget in all (``--quick``: the arm's curve gets its three points
    as the streaming arms', which end at their third retrain)."""
    from prmloop.flows.ops.engine import service_environment
    from prmloop.flows.ops.stack import down, up
    from prmloop.store.kafka.broker_file import find_bootstrap_servers
    from prmloop.store.tables.duck import StoreLocked, query

    started = time.monotonic()
    state = StateSettings(home=home)
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PRMLOOP_HOME"] = str(home)
    if engine_url:
        for key, value in service_environment(engine_url).items():
            os.environ.setdefault(key, value)
    up(["broker", "sink"], state=state, say=say)
    # Each stage runs alone in its group: it reads every partition without joining (a join waits about
    # 5 s on Tansu, five stages a round), committing its offsets under the group as before.
    assign_all_before = os.environ.get("KAFKA_ASSIGN_ALL")
    os.environ["KAFKA_ASSIGN_ALL"] = "1"
    servers = find_bootstrap_servers(KafkaSettings(), state)
    assert servers, "the arm's broker did not start"
    watch = EventWatch(servers, started=started).start()
    meter = EngineMeter(engine_url, started=started).start() if engine_url else None
    db = state.db_path

    def stored() -> int:
        try:
            return int(query(db, "SELECT count(*) FROM events", timeout_s=5).rows[0][0])
        except (StoreLocked, FileNotFoundError):
            return -1

    deadline = started + budget_s

    def left() -> float:
        return deadline - time.monotonic()

    settings = DemoSettings(home=home, minutes=budget_s / 60, threads=threads, levels=levels, seed=seed, rounds=rounds)
    stages = Stages(
        settings,
        servers,
        db,
        home,
        lambda stage, line: say(f"{stage}: {line}"),
        stored,
        left,
        # As many solutions in flight as the streaming arms' annotator keeps (a fair comparison).
        in_flight=LoopSettings().in_flight if engine_url else 1,
        eval_set=eval_set,
        idle_s=idle_s,
        # Five stages each start and drain until idle_s without input, two flow runs and a retrain: a
        # round's fixed cost (about 20 s with 1 s drains here).
        overhead_s=15.0 + 5 * idle_s,
        reserve_s=0.0,
    )
    curve: list[list[float]] = []
    retrains = 0
    try:
        speed = speed_probe(threads, engine_url)
        measured_tokens, measured_s = 0.0, 0.0
        index = 0
        while True:
            rate = (measured_tokens / measured_s) if measured_s > 20 else speed
            plan, overtime = next_round(
                tokens_per_s=rate,
                left_s=left(),
                index=index,
                rounds=rounds,
                overhead_s=stages.overhead_s,
                retrains=retrains,
                until_retrains=until_retrains,
                elapsed_s=time.monotonic() - started,
                budget_s=budget_s,
            )
            if overtime:
                # The round's stages see the time it needs as their budget (the annotator's cut reads it).
                deadline = max(deadline, time.monotonic() + round_seconds(rate, stages.overhead_s))
                say(f"rounds: round {index + 1} past the budget (the smallest round) for scored retrain {retrains + 1}")
            if plan is None:
                say(f"rounds: round {index + 1} cut ({left():.0f}s left at {rate:.0f} tokens/s)")
                break
            result = stages.round(index, max(rounds, index + 1), plan)
            index += 1
            measured_tokens += result["generated_tokens"]
            measured_s += result["generation_s"]
            retrained = result["retrain"]
            if retrained.get("metrics"):
                retrains += 1
                curve.append([round(time.monotonic() - started, 1), round(retrained["metrics"]["heldout_f1"], 4)])
            if until_retrains is not None and retrains >= until_retrains:
                break
        wait_stored(stored, timeout_s=30)
    finally:
        wall = time.monotonic() - started
        if assign_all_before is None:
            os.environ.pop("KAFKA_ASSIGN_ALL", None)
        else:
            os.environ["KAFKA_ASSIGN_ALL"] = assign_all_before
        watch.stop()
        if meter is not None:
            meter.stop()
        down(state=state, say=say)
    totals = watch.snapshot()
    accepted = totals.accepted
    tokens = totals.generated_tokens
    return {
        "engine": "vllm" if engine_url else "transformers",
        "wall_s": round(wall, 1),
        "accepted_labels": accepted,
        "accepted_with_error": totals.accepted_errors,
        "rejected_labels": totals.counts["LabelsRejected"],
        "mc_labels": totals.counts["StepsLabeled"],
        "solutions": totals.counts["SolutionSampled"],
        "accepted_per_minute": round(accepted / (wall / 60.0), 3),
        "generated_tokens": tokens,
        "engine_generated_tokens": meter.generated_tokens() if meter else None,
        "accepted_per_1k_tokens": round(1000.0 * accepted / tokens, 3) if tokens else 0.0,
        "engine_busy_fraction": _round(meter.busy_fraction(since_s=60.0) if meter else None),
        "engine_busy_fraction_all": _round(meter.busy_fraction() if meter else None),
        "f1_curve": curve,
        "retrains": retrains,
        "stage_overlap": round(totals.stage_overlap(), 3),
        "reject_reasons": dict(totals.reject_reasons.most_common(5)),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
