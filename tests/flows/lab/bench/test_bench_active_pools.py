"""bench active's pool cache and build costs: a pool is sampled once (the tiny random Llama as the
engine), a larger pool samples only what the cache lacks, verdicts come from the checker at load, the
engine is chosen as documented, and what a build will cost is said (and a budget refused) before
anything starts."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prmloop.flows.lab.bench import active
from prmloop.flows.lab.bench.active import ActiveSettings
from prmloop.flows.lab.bench.active_run import OverBudget, bench_active
from prmloop.flows.pools import build as active_pools
from prmloop.flows.pools.build import build_pool, read_lines
from prmloop.flows.pools.cost import estimate_pool
from prmloop.flows.pools.sampling import Sampler, describe_cost, record_speed, speed
from prmloop.models.arith import arith_question_id, generate_question, reference_solution
from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.backends.registry import BACKENDS
from prmloop.models.backends.transformers_backend import TransformersBackend
from prmloop.store.settings import StateSettings

SMALL = {"k": 2, "temperature": 0.7, "max_new_tokens": 8, "prompt_format": "step_k_arith", "seed": 0}


class Counting:
    """The tiny random Llama, counting the prompts it is asked to sample."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.backend, self.model_name, self.prompts = backend, backend.model_name, 0

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        self.prompts += len(prompts)
        return self.backend.generate(prompts, params)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(active_pools, "ARITH_SAMPLING", SMALL)
    return tmp_path / "home" / "bench" / "active"


@pytest.fixture
def engine(tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counting]:
    counting = Counting(tiny_backend)
    monkeypatch.setitem(BACKENDS, "transformers", lambda _config: counting)
    yield counting


def _rows(level: int, index: int) -> list[dict[str, Any]]:
    """A right solution (every step verified) and one whose first equation is false, as a build keeps them."""
    q = generate_question(level, 0, index)
    first = q.chain.steps[0]
    right = [f"Step {i + 1}: {s}" for i, s in enumerate(reference_solution(q))]
    wrong = [f"Step 1: {first.left} {first.op} {first.right} = {first.result + 1}", "The final answer is: 0"]
    return [
        {"question_id": arith_question_id(level, 0, index), "level": level, "sample": i, "problem": q.problem,
         "gold_answer": str(q.answer), "steps": steps, "answer": answer, "correct": ok, "tokens": 20}
        for i, (steps, answer, ok) in enumerate([(right, str(q.answer), True), (wrong, "0", False)])
    ]  # fmt: skip


def _write_pool(root: Path, levels: tuple[int, ...], questions: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cache = active_pools.arith_file(root, {**SMALL, "levels": levels})
    rows = [r for level in levels for index in range(questions) for r in _rows(level, index)]
    cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return cache


def _arith(root: Path, questions: int) -> list[Any]:
    return build_pool("arith", root=root, arith_questions=questions, arith_levels=(1, 2), engine="transformers")


def test_a_pool_is_sampled_once_and_a_larger_one_samples_only_what_the_cache_lacks(
    home: Path, engine: Counting
) -> None:
    lines: list[str] = []
    build_pool("arith", root=home, arith_questions=2, arith_levels=(1, 2), engine="transformers", say=lines.append)
    [cache] = home.glob("arith-*.jsonl")
    rows = read_lines(cache)
    assert engine.prompts == 4 and len(rows) == 2 * 2 * 2  # 2 levels x 2 questions x k = 2
    assert {r["engine"] for r in rows} == {"transformers"}
    assert "8 solutions to sample once" in lines[0] and "transformers in process (asked for)" in lines[0]
    assert any("left" in line and "tokens/s" in line for line in lines[1:])  # progress as it goes
    assert speed(home, "transformers.sample")[1].startswith("measured here")

    _arith(home, 2)  # the same pool again: nothing sampled
    assert engine.prompts == 4 and len(read_lines(cache)) == 8
    _arith(home, 3)  # one more question per level: only those two are sampled
    assert engine.prompts == 6 and len(read_lines(cache)) == 12
    build_pool("arith", root=home, arith_questions=3, arith_levels=(1,), engine="transformers")  # a subset
    assert engine.prompts == 6


def test_the_truth_is_the_checkers_verdict_on_the_kept_steps(home: Path) -> None:
    """Rows as a build leaves them; only the solutions the checker decides become pool items."""
    cache = _write_pool(home, (2,), 1)
    undecided = {**_rows(2, 0)[1], "sample": 2, "steps": ["Step 1: I like apples."], "answer": None}
    with cache.open("a") as handle:
        handle.write(json.dumps(undecided) + '\n{"question_id": "cut by a cra')
    items = build_pool("arith", root=home, arith_questions=1, arith_levels=(2,), engine="transformers")
    assert sorted((i.key, i.first_error) for i in items) == [
        (f"{arith_question_id(2, 0, 0)}/0", -1),  # every step verified, the answer right
        (f"{arith_question_id(2, 0, 0)}/1", 0),  # the first equation is false
    ]
    assert cache.read_text().endswith("}\n")  # the line cut by an interrupted write is gone


def test_the_sampler_uses_a_running_engine_else_vllm_if_ready_else_transformers_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path))
    monkeypatch.setenv("PRMLOOP_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    fallback = Sampler("auto")
    assert fallback.kind == "transformers" and "vLLM is not available" in fallback.note
    assert fallback.start_seconds == 0 and fallback.questions_per_call == 4
    with pytest.raises(ValueError, match="--engine vllm"):
        Sampler("vllm")
    with pytest.raises(ValueError, match="unknown engine"):
        Sampler("llama.cpp")
    # `prmloop up`'s engine, as its record says (a live process with the recorded command line).
    process = subprocess.Popen(["sleep", "60"])
    try:
        while b"sleep" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
            time.sleep(0.01)  # until the child has exec'd
        state = StateSettings()
        state.run_dir.mkdir(parents=True, exist_ok=True)
        record = {"name": "engine", "pid": process.pid, "argv": ["sleep", "60"], "started_at": 0.0, "log": "x"}
        (state.run_dir / "engine.json").write_text(json.dumps({**record, "url": "http://127.0.0.1:9/v1"}))
        running = Sampler("auto")
        assert running.kind == "vllm" and running.url == "http://127.0.0.1:9/v1" and running.start_seconds == 0
        assert running.questions_per_call == 64
        assert Sampler("transformers").kind == "transformers"  # asked for: the running engine is not used
    finally:
        process.kill()
        process.wait()


def test_a_build_says_what_it_will_cost_from_the_speeds_measured_here(home: Path) -> None:
    record_speed(home, "transformers.sample", 50.0)
    record_speed(home, "features", 4.0)
    cost = estimate_pool("arith", root=home, arith_questions=10, arith_levels=(1, 2, 3), engine="transformers")
    # 3 levels x 10 questions x k = 2 = 60 solutions x 55 tokens (no cache yet) at 50 tokens/s = 66 s;
    # features of 60 x 0.4 (the prior share the checker decides) = 24 solutions at 4/s = 6 s.
    assert cost["sample_solutions"] == 60 and cost["sample_tokens"] == 3300
    assert cost["features"] == 24 and cost["seconds"] == pytest.approx(72.0)
    assert "sampling 60 solutions (~3,300 tokens at 50 tokens/s, measured here" in cost["line"]
    assert cost["line"].endswith("about 72 s to build once")
    assert [describe_cost(s) for s in (0.2, 89, 600, 7200)] == [
        "about 1 s",
        "about 89 s",
        "about 10 min",
        "about 2.0 h",
    ]


def test_a_budget_skips_the_pools_it_cannot_build_and_refuses_when_none_is_left(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_pool(home, (1, 2), 3)  # cached: costs nothing but features
    monkeypatch.setattr(active, "_load_features", lambda items, *a, **k: {i.key: _features(i) for i in items})
    monkeypatch.setattr(active_pools, "_mc_labels", _no_rollouts)
    record_speed(home, "transformers.mc", 1.0)  # MC labels of 280 tokens each at 1 token/s: an hour or more
    settings = ActiveSettings(arms=("random", "full"), budgets=(0.5, 1.0), seeds=2, arith_questions=3,
                              arith_levels=(1, 2), mc_limit=24, engine="transformers")  # fmt: skip
    lines: list[str] = []
    monkeypatch.setattr(active, "held_out_f1", lambda *a, **k: 0.5)
    results = bench_active(["arith", "arith-mc"], settings, root=home, out_dir=None, budget_minutes=5, say=lines.append)
    assert set(results) == {"arith", "skipped"}
    assert results["arith"]["pool_solutions"] + results["arith"]["held_out_solutions"] == 12
    assert "MC labels of" in results["skipped"]["arith-mc"]
    assert "--max-build-minutes" in results["skipped"]["arith-mc"]
    assert any(line.startswith("skipped arith-mc") for line in lines)
    with pytest.raises(OverBudget, match=r"nothing to run: arith-mc: .*MC labels of"):
        bench_active(["arith-mc"], settings, root=home, out_dir=None, budget_minutes=5, say=lines.append)


def test_quick_on_a_fresh_home_refuses_a_pool_it_cannot_build_in_minutes(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows.cli import app

    record_speed(home, "transformers.sample", 0.5)
    out = CliRunner().invoke(app, ["bench", "active", "--quick", "--pool", "arith", "--engine", "transformers"])
    assert out.exit_code == 2, out.output
    assert "nothing to run: arith: sampling 80 solutions" in " ".join(out.output.split())
    assert not list(home.glob("arith-*.jsonl"))  # nothing was sampled


def _features(item: Any) -> Any:
    import numpy as np

    return np.ones((len(item.steps), 3), dtype=np.float32)


def _no_rollouts(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a pool over the budget must not be built")
