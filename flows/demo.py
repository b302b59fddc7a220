"""``prmloop demo``: the whole loop once, on the embedded defaults, within a time budget.

Stages, each a real run of the production code on the embedded SmolLM2 (CPU): register and
**prioritize** arithmetic-curriculum questions (a probe of a few samples each; the probes' graded
solutions are kept), **sample** the highest-priority questions from the queue, **score** their steps,
**annotate** incorrect ones with MC rollouts, **judge** them (by default the curriculum's exact step
checker: SmolLM2 is no judge, see the README; ``--judge critic|stepwise`` runs the LLM judge), **filter**
by consensus, **store** everything in DuckDB, **train** a PRM when the training code
and enough labels exist, **calibrate** the aggregation on a shared Best-of-N pool, and **prioritize
again**. A stage that is not available says so and the loop goes on.

Everything goes into a store of the demo's own (``$PRMLOOP_HOME/demo`` unless ``--home``): its DuckDB
file, outboxes, consensus state and Prefect state, never the user's store. Sizes come from a speed probe
(tokens per second of this machine) and the ``--minutes`` budget. Progress is printed as plain lines,
so logs and CI show it too. Flow runs go to a Prefect server: the one ``prmloop up`` started, or one the
demo starts in its home and leaves running for the UI (``prmloop down`` stops it). Ctrl-C or SIGTERM
stops everything the demo started.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["DEMO_QUERIES", "DemoPlan", "DemoSettings", "plan_sizes", "run_demo"]

#: Three queries the demo ends with (and runs), for the user to try with ``prmloop sql``.
DEMO_QUERIES = {
    "the queue: which questions the loop found most informative": (
        "SELECT question_id, round(priority, 3) AS priority, round = 0 AS first_round, "
        "signals->>'correct' AS probe_correct, signals->>'graded' AS probe_graded "
        "FROM question_priorities ORDER BY priority DESC LIMIT 8"
    ),
    "MC labels and whether consensus kept them": (
        "SELECT l.solution_id[:8] AS solution, l.method, l.first_error_step AS mc_first_error, "
        "c.decision, c.reason FROM (SELECT DISTINCT solution_id, method, first_error_step FROM label_history "
        "WHERE source = 'StepsLabeled') l LEFT JOIN consensus c ON c.solution_id = l.solution_id LIMIT 10"
    ),
    "what the labels cost": (
        "SELECT method, count(*) AS solutions, sum(rollouts) AS rollouts, sum(generated_tokens) AS tokens "
        "FROM cost_ledger GROUP BY ALL ORDER BY tokens DESC"
    ),
}


@dataclass(frozen=True)
class DemoSettings:
    home: Path | None = None
    minutes: float = 15.0
    threads: int | None = None
    level: int = 1
    seed: int = 0
    judge: Literal["exact", "critic", "stepwise"] = "exact"


@dataclass(frozen=True)
class DemoPlan:
    """Sizes chosen so the stages fit the budget at the measured speed."""

    tokens_per_s: float
    questions: int
    probe_k: int
    sample_questions: int
    k: int
    annotate: int
    judge: int
    max_new_tokens: int = 192
    rollout_tokens: int = 128

    def describe(self) -> str:
        return (
            f"{self.tokens_per_s:.0f} tokens/s: prioritize {self.questions} questions x {self.probe_k} probes, "
            f"sample {self.sample_questions} x {self.k}, annotate up to {self.annotate}, judge up to {self.judge}"
        )


#: Seconds of a demo run that are not generation: about eight model loads, the Prefect server, the
#: calibration and the waits for the store (measured on this 2-core machine: about 3 minutes).
FIXED_OVERHEAD_S = 180.0


def plan_sizes(tokens_per_s: float, minutes: float) -> DemoPlan:
    """Split the budget's generation time (the budget less :data:`FIXED_OVERHEAD_S`) over the stages,
    as tokens at the measured speed: prioritizing 20 %, sampling 20 %, annotation 35 %, judging 10 %,
    the second round 5 %; the rest is slack (the speed probe runs on an idle model)."""
    tokens = max(1.0, tokens_per_s) * max(60.0, minutes * 60.0 - FIXED_OVERHEAD_S)
    probe_k, k, per_solution, per_label, per_judged = 2, 4, 160, 1600, 250
    questions = max(2, min(24, int(0.20 * tokens / (probe_k * per_solution))))
    sample_questions = max(1, min(questions, int(0.20 * tokens / (k * per_solution))))
    return DemoPlan(
        tokens_per_s=tokens_per_s,
        questions=questions,
        probe_k=probe_k,
        sample_questions=sample_questions,
        k=k,
        annotate=max(1, min(8, int(0.35 * tokens / per_label))),
        judge=max(1, min(12, int(0.10 * tokens / per_judged))),
    )


@dataclass
class _Report:
    console: Console
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def stage(self, name: str, text: str) -> None:
        line = f"[{time.monotonic() - self.started:6.0f}s] {name}: {text}"
        self.lines.append(line)
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


def _speed_probe(threads: int | None) -> float:
    from prmloop.models.backends.base import SamplingParams
    from prmloop.models.backends.registry import EngineSettings, build_backend

    generator = build_backend(EngineSettings(threads=threads).backend_config())
    started = time.perf_counter()
    [[completion]] = generator.generate(
        ["Count: 1, 2, 3,"], SamplingParams(n=1, max_new_tokens=32, temperature=0.7, seed=0)
    )
    return completion.completion_tokens / max(time.perf_counter() - started, 1e-6)


@contextmanager
def _broker(report: _Report) -> Iterator[str]:
    configured = KafkaSettings().bootstrap_servers
    if configured:
        report.stage("broker", f"{configured} (KAFKA_BOOTSTRAP_SERVERS)")
        yield configured
        return
    from prmloop.store.broker import EmbeddedBroker
    from prmloop.store.kafka import ensure_topics

    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        report.stage("broker", f"embedded Tansu on {broker.bootstrap_servers}")
        yield broker.bootstrap_servers


@contextmanager
def _sink(db: Path, servers: str) -> Iterator[Callable[[], int]]:
    from prmloop.consumers.sink import run_sink
    from prmloop.store.duck import StoreLocked, query

    stop = threading.Event()
    thread = threading.Thread(
        target=run_sink,
        kwargs={"bootstrap_servers": servers, "db_path": db, "until": stop.is_set, "install_signal_handlers": False},
        daemon=True,
    )
    thread.start()

    def stored() -> int:
        try:
            return int(query(db, "SELECT count(*) FROM events", timeout_s=5).rows[0][0])
        except (StoreLocked, FileNotFoundError):
            return -1

    try:
        yield stored
    finally:
        stop.set()
        thread.join(timeout=30)


def _prefect_server(home: Path, report: _Report) -> tuple[str | None, bool]:
    """(UI URL, whether the demo started it): the server of ``prmloop up`` if one runs, else a new one."""
    from prmloop.flows.prefect_home import USER_CHOSE_PREFECT
    from prmloop.flows.stack import prefect_api_url, up

    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"].removesuffix("/api"), False
    if USER_CHOSE_PREFECT:
        return None, False
    url = prefect_api_url(StateSettings(home=home))
    started = False
    if url is None:
        up(["prefect"], state=StateSettings(home=home), say=lambda line: report.stage("prefect", line))
        url, started = prefect_api_url(StateSettings(home=home)), True
    if url:
        os.environ["PREFECT_API_URL"] = url
    return (url.removesuffix("/api") if url else None), started


def _stop_on_signals() -> None:
    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)


def run_demo(settings: DemoSettings | None = None) -> dict[str, Any]:
    """Run the loop once (see the module docstring); returns what each stage did."""
    from prmloop.flows.demo_stages import run_stages
    from prmloop.flows.prefect_home import isolate_prefect_state

    s = settings or DemoSettings()
    home = s.home or (StateSettings().home / "demo")
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PRMLOOP_HOME"] = str(home)  # every service's outbox and state goes into the demo's home
    console = Console()
    report = _Report(console)
    report.stage("home", f"{home} (its own DuckDB file, outboxes, consensus and Prefect state)")
    _stop_on_signals()
    ui, started_server = None, False
    with isolate_prefect_state(home):
        try:
            ui, started_server = _prefect_server(home, report)
            report.stage("prefect", f"flow runs go to {ui}" if ui else "a throw-away local Prefect API")
            tokens_per_s = _speed_probe(s.threads)
            plan = plan_sizes(tokens_per_s, s.minutes)
            report.stage("plan", f"{plan.describe()} (budget {s.minutes:g} min)")
            db = home / "prmloop.duckdb"
            with _broker(report) as servers, _sink(db, servers) as stored:
                outcome = run_stages(plan, s, servers=servers, db=db, report=report.stage, stored=stored)
        except KeyboardInterrupt:
            report.stage("interrupted", "stopping what the demo started")
            if started_server:
                from prmloop.flows.stack import down

                down(state=StateSettings(home=home), say=lambda line: report.stage("prefect", line))
            raise
    _print_results(console, db)
    console.print(f"\nDone in {time.monotonic() - report.started:.0f}s. The store: {db}", soft_wrap=True)
    if ui:
        console.print(f"Prefect UI (flow runs, artifacts): {ui}")
        if started_server:
            console.print(f"  it keeps running for you; stop it with: PRMLOOP_HOME={home} prmloop down", soft_wrap=True)
    console.print("Try:")
    for sql in DEMO_QUERIES.values():
        console.print(f'  prmloop sql --db {db} "{sql}"', markup=False, highlight=False, soft_wrap=True)
    return {"home": str(home), "db": str(db), "ui": ui, "plan": plan.__dict__, **outcome}


def _print_results(console: Console, db: Path) -> None:
    from prmloop.store.duck import QueryError, query

    for title, sql in DEMO_QUERIES.items():
        try:
            result = query(db, sql)
        except QueryError as exc:
            console.print(f"{title}: {exc}", markup=False)
            continue
        table = Table(*result.columns, title=title)
        for row in result.rows:
            table.add_row(*(str(v) for v in row))
        console.print(table)
