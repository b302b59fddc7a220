"""``prmloop demo``: the streaming loop (``prmloop run``), time-boxed, on the embedded defaults.

Every service runs at once on one engine (the machine's vLLM engine where ``make vllm`` made it ready,
else transformers in each service): the sampler's feeds, the scorer, selector, annotator (MC rollouts),
the exact judge, consensus and the sink act as events arrive, and the ensemble PRM is retrained as
accepted labels arrive, each retrain scored on a held-out set of the model's own solutions to questions
the loop never samples (exact first errors from the curriculum's checker, made once and cached). The
terminal shows a live view and ends with the learning curve (a table here, a PNG artifact in the UI),
the run's figures and queries to try.

Where things go: the demo uses ``$PRMLOOP_HOME`` (``~/.prmloop``), the store every command reads, so
``prmloop status``, ``prmloop sql``, ``prmloop models list`` and ``prmloop down`` find it afterwards. It
writes nothing into the working directory; its libraries' output goes to ``$PRMLOOP_HOME/logs/demo.log``.
The broker, the sink and the Prefect server keep running afterwards (nothing published is lost, the
UI stays up); ``prmloop down`` stops them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from prmloop.flows.loop.driver import LoopError, LoopSettings
from prmloop.flows.loop.terminal import Terminal, finish, leave, run_session
from prmloop.store.settings import StateSettings

__all__ = ["DEMO_QUERIES", "DemoError", "DemoSettings", "command_prefix", "next_commands", "run_demo"]

#: Queries the demo ends with (and runs), for the user to try with ``prmloop sql``.
DEMO_QUERIES = {
    "the loop learning: each retrain's ensemble PRM on the test set, with its 95 % interval": (
        "SELECT model_id[-12:] AS model, train_examples AS trained_on, "
        "round(CAST(metrics->>'test_f1' AS DOUBLE), 3) AS test_f1, "
        "round(CAST(metrics->>'test_f1_lo' AS DOUBLE), 3) AS lo, "
        "round(CAST(metrics->>'test_f1_hi' AS DOUBLE), 3) AS hi, "
        "round(CAST(metrics->>'heldout_f1' AS DOUBLE), 3) AS validation_f1, promoted "
        "FROM model_versions WHERE kind = 'prm_ensemble' ORDER BY registered_at"
    ),
    "what consensus decided, and why": (
        "SELECT decision, coalesce(reason, '-') AS reason, count(*) AS solutions FROM consensus "
        "GROUP BY ALL ORDER BY solutions DESC LIMIT 8"
    ),
    "what the labels cost": (
        "SELECT method, count(*) AS solutions, sum(rollouts) AS rollouts, sum(generated_tokens) AS tokens "
        "FROM cost_ledger GROUP BY ALL ORDER BY tokens DESC"
    ),
}

#: Seconds of the budget kept for stopping and the summary.
RESERVE_S = 45.0


class DemoError(RuntimeError):
    """The demo cannot run as asked (one line, said to the user)."""


@dataclass(frozen=True)
class DemoSettings:
    home: Path | None = None
    minutes: float = 15.0
    threads: int | None = None
    levels: tuple[int, ...] = (1, 2, 3, 4, 5)
    seed: int = 0
    judge: Literal["exact", "critic", "stepwise"] = "exact"
    #: auto: the machine's vLLM engine where ``make vllm`` made it ready, else transformers.
    engine: Literal["auto", "transformers", "vllm"] = "auto"

    def loop_settings(self) -> LoopSettings:
        return LoopSettings(
            minutes=self.minutes,
            engine=self.engine,
            levels=self.levels,
            seed=self.seed,
            threads=self.threads,
            eval_set="arith",
            calibrate_minutes=max(1.0, self.minutes / 2),
        )


def command_prefix(home: Path, shell_home: Path) -> str:
    """How to call ``prmloop`` so a printed command runs as it stands: ``prmloop`` when the shell finds
    this one on its PATH, else its path (``.venv/bin/prmloop`` after ``make demo``); with
    ``PRMLOOP_HOME=...`` in front when the demo's home is not ``shell_home``, the one the shell uses."""
    own = Path(sys.executable).parent / "prmloop"
    found = shutil.which("prmloop")
    if found and Path(found).resolve() == own.resolve():
        command = "prmloop"
    else:
        relative = os.path.relpath(own)
        command = relative if not relative.startswith("..") else str(own)
    if home.expanduser().resolve() != shell_home.expanduser().resolve():
        command = f"PRMLOOP_HOME={home} {command}"
    return command


def next_commands(home: Path, *, shell_home: Path, prefect_started: bool) -> list[str]:
    """The commands the demo ends with, exactly as printed (each runs as it stands in the shell)."""
    p = command_prefix(home, shell_home)
    commands = [f"{p} status", f"{p} models list"]
    commands += [f'{p} sql "{sql}"' for sql in list(DEMO_QUERIES.values())[:2]]
    if prefect_started:
        commands.append(f"{p} down")
    return commands


def run_demo(settings: DemoSettings | None = None) -> dict[str, Any]:
    """Run the streaming loop for the budget (see the module docstring); returns its figures."""
    s = settings or DemoSettings()
    shell_home = StateSettings().home
    home = (s.home or shell_home).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PRMLOOP_HOME"] = str(home)
    if s.judge != "exact":
        os.environ["PRMLOOP_JUDGE_METHOD"] = s.judge
    term = Terminal(home / "logs" / "demo.log")
    db = StateSettings().store_location
    existing = Path(db).is_file() if not str(db).startswith("ducklake:") else True
    adding = ", adding to what it holds" if existing else ""
    term.stage("home", f"{home} (store {Path(str(db)).name}{adding}); log {term.log_path}")
    try:
        loop, result = run_session(s.loop_settings(), home, name="demo", term=term, reserve_s=RESERVE_S)
    except LoopError as exc:
        raise DemoError(str(exc)) from None
    finish(loop, result, term)
    commands = next_commands(home, shell_home=shell_home, prefect_started=bool(loop.status.ui))
    _summary(term, result, loop.status.ui, db, commands)
    leave(loop)
    return {"home": str(home), "db": str(db), "ui": loop.status.ui, **result}


def _summary(term: Terminal, r: dict[str, Any], ui: str | None, db: Path | str, commands: list[str]) -> None:
    busy = r["engine_busy_fraction"]
    term.say(
        f"In {r['wall_s'] / 60:.1f} min on {r['engine']}: {r['accepted_labels']} accepted labels "
        f"({r['accepted_per_minute']:.1f} per minute, {r['accepted_with_error']} with a first error), "
        f"{r['rejected_labels']} rejected, {r['mc_labels']} MC labels; {r['solutions']} solutions, "
        f"{r['generated_tokens']:,} generated tokens ({r['accepted_per_1k_tokens']:.2f} accepted labels per 1k)"
        + (f"; engine busy {100 * busy:.0f}% after warm-up" if busy is not None else "")
        + "."
    )
    quality = _label_quality(db)
    if quality:
        rate, agree = quality.get("acceptance_rate"), quality.get("mc_exact_agreement")
        exact = (quality.get("agreement") or {}).get("exact") or {}
        term.say(
            "Consensus kept "
            + (f"{100 * rate:.0f}% of the decided solutions" if rate is not None else "none yet")
            + (
                f"; MC and the exact checker agree on {100 * agree:.0f}% of the {exact.get('decided')} solutions "
                f"both labelled and the checker decided"
                if agree is not None
                else ""
            )
            + "."
        )
    if r["reject_reasons"]:
        reasons = "; ".join(f"{n} x {why}" for why, n in r["reject_reasons"].items())
        term.say(f"Why consensus rejected labels: {reasons}")
    for error in r["errors"]:
        term.say(f"Last error (see the log): {error}")
    _print_queries(term.console, db)
    term.say(f"The store: {db}. Log: {term.log_path}")
    if ui:
        term.say(f"Prefect UI (flow runs feed and retrain, artifacts loop-learning-curve and loop-summary): {ui}")
    term.say(
        "Still running for the UI and the work in flight: the broker, the sink, Prefect (`prmloop down` stops them)."
    )
    term.say("Next, as they stand:")
    for command in commands:
        term.say(f"  {command}")


def _label_quality(db: Path | str) -> dict[str, Any] | None:
    """Acceptance rate and MC-vs-exact agreement over the store (None: it cannot be read now)."""
    from prmloop.store.tables.duck import QueryError, StoreLocked
    from prmloop.store.tables.metrics import label_quality

    try:
        return label_quality(db)
    except (QueryError, StoreLocked, FileNotFoundError):
        return None


def _print_queries(console: Console, db: Path | str) -> None:
    from prmloop.store.tables.duck import QueryError, StoreLocked, query

    for title, sql in list(DEMO_QUERIES.items())[1:]:  # the first, the learning curve, is printed above
        try:
            result = query(db, sql, timeout_s=30)
        except (QueryError, StoreLocked, FileNotFoundError) as exc:
            console.print(f"{title}: {exc}", markup=False)
            continue
        if not result.rows:
            continue
        table = Table(*result.columns, title=title)
        for row in result.rows:
            table.add_row(*(str(v) for v in row))
        with contextlib.suppress(BrokenPipeError):
            console.print(table)
