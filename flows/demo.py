"""``prmloop demo``: the furthest part of the loop that runs end to end today, on embedded defaults.

It starts the embedded broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` names one) and the sink, runs the
Prefect ``sample`` flow on a few GSM8K questions with the embedded SmolLM2 (real solutions, token
log-probs, uncertainty, grades), scores every sampled solution's steps (``steps.scored``), labels the
first ``annotate`` incorrect ones with SmolLM2 rollouts (adaptive binary search, small sample counts
so it fits a laptop), optionally adds a stream of synthetic label events, waits until every event is
queryable, and shows the result with SQL. The DuckDB file stays in ``$PRMLOOP_HOME`` for
``prmloop sql`` afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prmloop.consumers.sink import run_sink
from prmloop.flows.bench.synthetic import synthetic_events
from prmloop.store.broker import EmbeddedBroker
from prmloop.store.duck import StoreLocked, query
from prmloop.store.kafka import EventProducer, ensure_topics
from prmloop.store.outbox import Outbox
from prmloop.store.settings import KafkaSettings, StateSettings

DEMO_QUERIES = {
    "sampled solutions": (
        "SELECT question_id, count(*) AS solutions, sum(correct::INT) AS correct, "
        "round(avg(entropy), 3) AS mean_entropy, sum(completion_tokens) AS tokens "
        "FROM solutions GROUP BY ALL ORDER BY question_id LIMIT 10"
    ),
    "step uncertainty of the first sampled solution (UnPRM Δu)": (
        "SELECT step_index, round(uncertainty, 3) AS u, round(uncertainty_delta, 3) AS delta_u FROM step_scores "
        "WHERE solution_id = (SELECT min(solution_id) FROM step_scores) ORDER BY step_index LIMIT 12"
    ),
    "events per type": "SELECT event_type, count(*) AS events FROM events GROUP BY ALL ORDER BY events DESC",
    "first-error position of labelled incorrect solutions": (
        "SELECT first_error_step, count(DISTINCT solution_id) AS solutions FROM current_labels "
        "WHERE first_error_step IS NOT NULL GROUP BY ALL ORDER BY first_error_step LIMIT 10"
    ),
    "labelling cost by method": (
        "SELECT method, count(*) AS solutions, sum(rollouts) AS rollouts, sum(generated_tokens) AS tokens "
        "FROM cost_ledger GROUP BY ALL"
    ),
}


@contextmanager
def _broker(console: Console) -> Iterator[str]:
    configured = KafkaSettings().bootstrap_servers
    if configured:
        console.print(f"broker: {configured} (KAFKA_BOOTSTRAP_SERVERS)")
        yield configured
        return
    with EmbeddedBroker() as broker:
        console.print(f"broker: embedded Tansu on {broker.bootstrap_servers}")
        yield broker.bootstrap_servers


def _stored(db: Path) -> int:
    try:
        return int(query(db, "SELECT count(*) FROM events", timeout_s=5).rows[0][0])
    except (StoreLocked, FileNotFoundError):
        return -1


def _score_and_annotate(console: Console, servers: str, annotate: int) -> int:
    """Score the sampled solutions' steps, then label ``annotate`` incorrect ones; events published."""
    from prmloop.consumers.annotator import AnnotatorSettings, run_annotator
    from prmloop.consumers.scorer import ScorerSettings, run_scorer

    counters = run_scorer(ScorerSettings(until_idle=5), bootstrap_servers=servers, install_signal_handlers=False)
    console.print(f"scored the steps of {counters['published']} solutions from their own token log-probs")
    if annotate <= 0:
        return int(counters["published"])
    # Small sample counts so one search fits a laptop: 4..8 rollouts per state, 160 tokens each.
    settings = AnnotatorSettings(
        strategy="adaptive_binary",
        n0=4,
        n_min=2,
        n_max=8,
        max_new_tokens=160,
        until_idle=10,
        max_solutions=annotate,
    )
    console.print(f"labelling {annotate} incorrect solution(s) with SmolLM2 rollouts (adaptive binary search)")
    summary = run_annotator(settings, bootstrap_servers=servers, install_signal_handlers=False)
    console.print(
        f"labelled {summary['labelled']} (+{summary['all_correct']} correct ones; {summary['unresolved']} unresolved: "
        f"the completer never reached the gold answer) with {summary['rollouts']} rollouts, "
        f"{summary['generated_tokens']} tokens in {summary['wall_s']:.0f}s"
    )
    return int(counters["published"]) + int(summary["published"])


def run_demo(n_events: int = 0, db_path: Path | None = None, questions: int = 3, k: int = 4, annotate: int = 1) -> None:
    """Sample ``questions`` GSM8K questions with the embedded SmolLM2 (``k`` solutions each) through
    the Prefect ``sample`` flow, score their steps, label ``annotate`` of them with SmolLM2 rollouts,
    add ``n_events`` synthetic events; store everything; query it."""
    console = Console()
    state = StateSettings()
    db = db_path or state.db_path
    events = synthetic_events(n_events, seed=int(time.time())) if n_events else []
    with _broker(console) as servers:
        ensure_topics(servers)
        stop = threading.Event()
        sink = threading.Thread(
            target=run_sink,
            kwargs={
                "bootstrap_servers": servers,
                "db_path": db,
                "until": stop.is_set,
                "install_signal_handlers": False,
            },
            daemon=True,
        )
        sink.start()
        before = max(0, _stored(db))
        started = time.monotonic()
        expected = len(events)
        if questions:
            from prmloop.flows.sample import run_sample
            from prmloop.producers.sampler import SampleSettings

            console.print(f"sampling {questions} GSM8K questions x {k} solutions with SmolLM2-135M on the CPU")
            settings = SampleSettings(
                dataset="gsm8k",
                limit=questions,
                k=k,
                m=1,
                n=k - 1,
                max_new_tokens=256,
                publish_unselected=True,
                batch_size=1,
            )
            summary = run_sample(settings, bootstrap_servers=servers)
            expected += int(summary["events_published"])
            console.print(
                f"sampled {summary['solutions']} solutions: {summary['correct']} correct, "
                f"{summary['unparseable']} without a final answer, {summary['tokens_per_s']:.1f} tokens/s"
            )
            expected += _score_and_annotate(console, servers, annotate)
        with EventProducer(servers, outbox=Outbox(state.outbox_dir, "demo")) as producer, Progress() as bar:
            if events:
                publish = bar.add_task("publishing synthetic events", total=len(events))
                for i in range(0, len(events), 1000):
                    producer.publish(events[i : i + 1000])
                    bar.advance(publish, len(events[i : i + 1000]))
            store = bar.add_task("stored in DuckDB", total=expected)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                done = _stored(db) - before
                bar.update(store, completed=max(0, done))
                if done >= expected:
                    break
                time.sleep(0.3)
        elapsed = time.monotonic() - started
        stop.set()
        sink.join(timeout=30)
    console.print(f"{expected} events published and stored in {elapsed:.1f}s -> {db}")
    for title, sql in DEMO_QUERIES.items():
        result = query(db, sql)
        table = Table(*result.columns, title=title)
        for row in result.rows:
            table.add_row(*(str(v) for v in row))
        console.print(table)
    console.print(f'try: prmloop sql "SELECT * FROM current_labels LIMIT 5" --db {db}')
