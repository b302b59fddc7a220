"""The round-based arm's plan per round, the learning curve from the store, the loop's engine choice, and
the commands the demo ends with, run as printed in a shell that has only the PATH `make demo` leaves
(no activated virtual environment)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.demo.main import command_prefix, next_commands
from prmloop.flows.lab.bench.rounds import FINAL_RESERVE_S, ROUND_OVERHEAD_S, plan_round
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.events import ModelRef
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore
from prmloop.store.tables.metrics import loop_metrics
from prmloop.store.tables.registry import model_registered


def test_a_round_gets_its_share_of_the_time_left_as_tokens() -> None:
    # 900 s left, 3 rounds: (900 - 60 - 3 x 75) / 3 = 205 s at 20 tokens/s = 4100 tokens; 40 % for
    # prioritizing and sampling at (2 probes + 4 samples) x 70 tokens a question = 3.9 -> 3 questions;
    # 60 % at 500 tokens a label = 4.9 -> 4
    assert (FINAL_RESERVE_S, ROUND_OVERHEAD_S) == (60.0, 75.0)
    plan = plan_round(20.0, 900.0, 3)
    assert plan is not None and (plan.questions, plan.k, plan.annotate) == (3, 4, 4)
    # the last round gets all that is left: (400 - 60 - 75) x 20 = 5300 -> 5.05 -> 5; 6.36 -> capped at 6
    last = plan_round(20.0, 400.0, 1)
    assert last is not None and (last.questions, last.annotate) == (5, 6)
    # three rounds leave none a question: fewer, larger rounds. 2 tokens/s: one round of
    # (900 - 60 - 75) x 2 = 1530 tokens -> 1.46 -> 1 question, 1.8 -> 1 label. Seen on a GPU's --quick
    # (181 tokens/s, 74 s left, 20 s a round, no reserve): three rounds 14 s -> 845 tokens each -> 0;
    # two rounds (74 - 40) x 181 / 2 = 3077 tokens -> 2.93 -> 2 questions, 3.69 -> 3 labels
    slow = plan_round(2.0, 900.0, 3)
    assert slow is not None and (slow.questions, slow.annotate) == (1, 1)
    short = plan_round(181.0, 74.0, 3, overhead_s=20.0, reserve_s=0.0)
    assert short is not None and (short.questions, short.annotate) == (2, 3)
    # too slow or too late for one question even in one round: the round is cut
    assert plan_round(1.0, 900.0, 3) is None
    assert plan_round(50.0, 100.0, 1) is None


def _store_with_a_learning_curve(home: Path, tmp_path: Path) -> DuckEventStore:
    store = DuckEventStore(home / "prmloop.duckdb")
    events = synthetic_events(60, k=4, seed=3)
    for i in range(2):
        artifact = tmp_path / f"prm-{i}"
        artifact.mkdir()
        (artifact / "heads.pt").write_bytes(bytes([i]))
        events.append(
            model_registered(
                artifact=artifact,
                base_model=ModelRef(backend="transformers", name="smollm2"),
                snapshot_id=f"snap-{i}",
                train_examples=3 + 2 * i,
                config={"kind": "ensemble"},
                metrics={"heldout_f1": 0.2 + 0.1 * i},
                promoted=True,
                decision="test",
                kind="prm_ensemble",
            )
        )
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 62)])
    return store


def test_the_learning_curve_lists_each_rounds_ensemble_with_what_was_spent(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = _store_with_a_learning_curve(home, tmp_path)
    learning = loop_metrics(store.location)["learning"]
    assert [r["round"] for r in learning] == [1, 2]
    assert [r["train_solutions"] for r in learning] == [3, 5]
    assert [round(r["heldout_f1"], 3) for r in learning] == [0.2, 0.3]
    assert all(r["promoted"] for r in learning)
    assert learning[0]["generated_tokens"] <= learning[1]["generated_tokens"]


def test_the_commands_the_demo_ends_with_run_as_printed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _store_with_a_learning_curve(home, tmp_path)
    commands = next_commands(home, shell_home=Path.home() / ".prmloop", prefect_started=False)
    assert commands[0].startswith(f"PRMLOOP_HOME={home} ")  # not the shell's home: said in the command
    assert len(commands) == 4
    # The PATH `make demo` leaves: the system's, without the virtual environment's bin folder.
    env = {k: v for k, v in os.environ.items() if k not in ("PRMLOOP_HOME", "VIRTUAL_ENV", "PRMLOOP_STORE")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], check=False, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{command}: {done.stderr[-600:]}"
        assert done.stdout.strip(), command
        if "trained_on" in command:  # each model is told apart by its digest, not its kind's first letters
            assert len(set(re.findall(r"\b[0-9a-f]{12}\b", done.stdout))) == 2, done.stdout


def test_the_prefix_is_plain_prmloop_only_when_the_shell_finds_this_one(tmp_path: Path) -> None:
    home = Path.home() / ".prmloop"
    prefix = command_prefix(home, home)
    import shutil
    import sys

    own = Path(sys.executable).parent / "prmloop"
    found = shutil.which("prmloop")
    expected_plain = bool(found) and Path(found).resolve() == own.resolve()  # type: ignore[arg-type]
    assert (prefix == "prmloop") == expected_plain
    if not expected_plain:
        assert prefix.endswith("bin/prmloop") and "PRMLOOP_HOME" not in prefix


def test_the_loop_runs_on_transformers_where_the_engine_is_not_ready_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows.loop.driver import Loop, LoopError, LoopSettings

    monkeypatch.setenv("PRMLOOP_VLLM_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    said: list[str] = []
    assert not Loop(LoopSettings(engine="auto"), home=tmp_path, say=said.append).start_engine()
    assert len(said) == 1 and "nowhere" in said[0] and "transformers" in said[0]
    with pytest.raises(LoopError, match=r"^--engine vllm: .*nowhere.*--engine transformers$"):
        Loop(LoopSettings(engine="vllm"), home=tmp_path).start_engine()
    assert not Loop(LoopSettings(engine="transformers"), home=tmp_path, say=said.append).start_engine()
    assert len(said) == 1  # --engine transformers looks for no engine


def test_demo_engine_must_be_one_it_knows() -> None:
    from typer.testing import CliRunner

    from prmloop.flows.cli import app

    result = CliRunner().invoke(app, ["demo", "--engine", "tpu"])
    assert result.exit_code == 2 and "--engine must be auto, transformers or vllm" in result.output
