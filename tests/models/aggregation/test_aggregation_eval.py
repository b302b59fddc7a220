"""The vectorized rules against the per-question reference loop, the evaluation protocol, the pool
loader on a small slice of the real Best-of-N data, and the eval / bench / calibrate entry points."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from prmloop.models.aggregation.calibration import fit_calibration
from prmloop.models.aggregation.evaluation import compute_fraction, evaluate_aggregation, split_questions
from prmloop.models.aggregation.loader import load_pool
from prmloop.models.aggregation.methods import NO_ANSWER
from prmloop.models.aggregation.naive import select_naive
from prmloop.models.aggregation.pool import CandidatePool, ScoredCandidates, ScoreKind, subsample_indices
from prmloop.models.aggregation.selection import METHODS, available_methods, select


def random_pool(seed: int, n_questions: int = 60, n: int = 12, score_kind: ScoreKind = "probability") -> CandidatePool:
    """Few distinct answers, scores on a coarse grid (many exact ties), some unanswered candidates,
    ragged step counts; right answers score a little higher on average."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 4, size=(n_questions, n))
    answers = np.full_like(raw, NO_ANSWER)
    for q in range(n_questions):  # renumber by first appearance, as the loader does
        seen: dict[int, int] = {}
        for i, a in enumerate(raw[q]):
            answers[q, i] = seen.setdefault(int(a), len(seen))
    answers[rng.random(answers.shape) < 0.05] = NO_ANSWER
    right = rng.integers(0, 3, size=n_questions)
    correct = (answers == right[:, None]) & (answers != NO_ANSWER)
    n_steps = rng.integers(1, 5, size=(n_questions, n))
    steps = np.round(rng.random((n_questions, n, 4)) * 8) / 8
    steps = np.clip(steps + 0.25 * correct[:, :, None], 0.0, 1.0)
    steps[np.arange(4)[None, None, :] >= n_steps[:, :, None]] = np.nan
    if score_kind == "reward":
        steps = 6.0 * steps - 2.0
    return CandidatePool(
        question_ids=tuple(f"q{i}" for i in range(n_questions)),
        answers=answers.astype(np.int64),
        correct=correct,
        step_scores=steps,
        n_steps=n_steps.astype(np.int64),
        score_kind=score_kind,
    )


@pytest.mark.parametrize(("seed", "score_kind"), [(0, "probability"), (1, "probability"), (2, "reward")])
def test_vectorized_and_per_question_loop_select_identically(seed: int, score_kind: ScoreKind) -> None:
    pool = random_pool(seed, score_kind=score_kind)
    fit = fit_calibration(pool.take(np.arange(20)), objective_ns=(4, 12), objective_repeats=2)
    cands = ScoredCandidates.from_pool(pool.take(np.arange(20, 60)))
    sub = cands.subsample(subsample_indices(40, 12, 5, 3, np.random.default_rng(seed)))
    for c in (cands, sub):
        methods = available_methods(c, fit)
        assert {"kde_wv", "optimal", "logit_wv"} <= set(methods)
        for name in methods:
            np.testing.assert_array_equal(select(name, c, fit), select_naive(name, c, fit), err_msg=name)


def test_every_registered_method_agrees_on_a_single_candidate() -> None:
    pool = random_pool(3)
    fit = fit_calibration(pool.take(np.arange(20)), objective_ns=(4,), objective_repeats=2)
    one = ScoredCandidates.from_pool(pool).subsample(subsample_indices(60, 12, 1, 1, np.random.default_rng(0)))
    picks = {name: select(name, one, fit) for name in METHODS}
    for name, chosen in picks.items():
        np.testing.assert_array_equal(chosen, one.answers[:, 0], err_msg=name)


def test_subsamples_keep_candidate_order_and_never_repeat_a_candidate() -> None:
    idx = subsample_indices(7, 10, 4, 5, np.random.default_rng(0))
    assert idx.shape == (5, 7, 4)
    assert (np.diff(idx, axis=2) > 0).all()


def test_splits_are_disjoint_and_cover_every_question() -> None:
    cal, test = split_questions(50, 20, seed=1)
    assert len(cal) == 20 and len(test) == 30
    assert sorted(np.r_[cal, test].tolist()) == list(range(50))
    with pytest.raises(ValueError, match="calibration_size"):
        split_questions(10, 10, seed=0)


def test_compute_fraction_on_the_grid_and_interpolated_in_log_n() -> None:
    ns = [1, 2, 4, 8, 16, 32]
    acc = [0.50, 0.60, 0.70, 0.80, 0.85, 0.90]
    # reaching 0.75 happens between N = 4 (0.70) and N = 8 (0.80): halfway in log2 N -> N = 4 * sqrt(2)
    grid, interp = compute_fraction(ns, acc, target=0.75)
    assert grid == 8 / 32
    assert interp == pytest.approx(4 * 2**0.5 / 32)
    assert compute_fraction(ns, acc, target=0.95) == (None, None)
    assert compute_fraction(ns, acc, target=0.40) == (1 / 32, 1 / 32)


def test_evaluation_reports_every_method_at_every_budget_with_spread_over_splits() -> None:
    pool = random_pool(4, n_questions=60, n=8)
    ev = evaluate_aggregation(pool, ns=(1, 2, 4, 8), subsamples=3, splits=2, calibration_size=20)
    assert set(ev.methods) >= {"majority", "vanilla_wv", "logit_wv", "linear_wv", "kde_wv", "hmr", "wrf"}
    for name in ev.methods:
        assert np.asarray(ev.accuracy[name]).shape == (2, 4)
        assert 0.0 <= min(ev.mean(name)) <= max(ev.mean(name)) <= 1.0
    # at N = 1 there is nothing to aggregate: every method has the same accuracy
    assert len({round(ev.mean(k)[0], 12) for k in ev.methods}) == 1
    # pass@N is an upper bound for every method at every N
    bound = np.asarray(ev.mean("pass_at_n"))
    for name in ev.methods:
        assert (np.asarray(ev.mean(name)) <= bound + 1e-12).all()
    out = ev.to_dict()
    json.dumps(out)
    assert out["baseline"] == "vanilla_wv@N=8"
    assert "| Logit WV |" in ev.markdown()


# --- the loader on the real pools ------------------------------------------------------------------


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRMLOOP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_loader_groups_answers_and_reads_step_scores(shared_data_dir: Path, private_cache: Path) -> None:
    bon = shared_data_dir / "bon"
    pool = load_pool(bon / "gsm8k_candidates.jsonl.gz", bon / "step_scores" / "qwen_prm_gsm8k.jsonl.gz", limit=8)
    assert pool.answers.shape == (8, 32)
    assert (pool.answers[:, 0] == 0).all()  # numbered by first appearance
    assert pool.prm_name == "qwen_prm" and pool.score_kind == "probability" and pool.dataset == "gsm8k"
    assert pool.n_steps.min() >= 1
    assert list(private_cache.glob("aggregation/grouping-gsm8k*.json"))
    # gsm8k_000 (Janet's ducks, 18): its first candidate answers 18 and is right
    assert pool.correct[0, 0]


def test_internlm2_scores_are_declared_rewards_not_probabilities(shared_data_dir: Path, private_cache: Path) -> None:
    bon = shared_data_dir / "bon"
    pool = load_pool(
        bon / "gsm8k_candidates.jsonl.gz", bon / "step_scores" / "internlm2_1_8b_reward_gsm8k.jsonl.gz", limit=4
    )
    assert pool.score_kind == "reward"


def test_math500_pool_is_refused_without_the_reference_answers(shared_data_dir: Path, private_cache: Path) -> None:
    bon = shared_data_dir / "bon"
    with pytest.raises(ValueError, match=r"math500_test\.jsonl"):
        load_pool(bon / "math500_candidates.jsonl.gz", bon / "step_scores" / "qwen_prm_math500.jsonl.gz", limit=3)


def test_math500_is_regraded_against_the_reference(shared_data_dir: Path, private_cache: Path) -> None:
    bon = shared_data_dir / "bon"
    pool = load_pool(
        bon / "math500_candidates.jsonl.gz",
        bon / "step_scores" / "qwen_prm_math500.jsonl.gz",
        reference_path=shared_data_dir / "math" / "math500_test.jsonl",
        limit=3,
    )
    # problem 0's stored ground truth is "2"; the reference is (3, pi/2), which its candidates give
    assert pool.correct[0].mean() > 0.5


def test_a_file_that_is_not_a_pool_gives_an_actionable_error(tmp_path: Path, private_cache: Path) -> None:
    bad = tmp_path / "pool.jsonl.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("this is not json\n")
    with pytest.raises(ValueError, match=r"pool.jsonl.gz:1 is not valid JSON"):
        load_pool(bad, bad)


def test_a_score_file_of_another_pool_is_refused(shared_data_dir: Path, private_cache: Path) -> None:
    bon = shared_data_dir / "bon"
    with pytest.raises(ValueError, match="no step scores"):
        load_pool(bon / "gsm8k_candidates.jsonl.gz", bon / "step_scores" / "qwen_prm_math500.jsonl.gz", limit=2)


# --- entry points ----------------------------------------------------------------------------------


def test_eval_aggregate_writes_table_fit_and_plots(shared_data_dir: Path, private_cache: Path, tmp_path: Path) -> None:
    from prmloop.flows.lab.evals.aggregate import eval_aggregate

    out = eval_aggregate(
        shared_data_dir / "bon" / "gsm8k_candidates.jsonl.gz",
        ns=(1, 4, 32),
        subsamples=2,
        splits=2,
        calibration_size=15,
        limit=40,
        out_dir=tmp_path / "out",
    )
    assert out["ns"] == [1, 4, 32]
    assert "logit_wv" in out["compute_fraction"]
    for key in ("accuracy_png", "weights_png"):
        assert Path(out["files"][key]).read_bytes()[:4] == b"\x89PNG"
    fit = json.loads(Path(out["files"]["calibration_json"]).read_text())
    assert fit["prm_name"] == "qwen_prm" and 0 < fit["logit_b"] < 1


def test_bench_aggregate_reports_timings_and_identical_selections(shared_data_dir: Path, private_cache: Path) -> None:
    from prmloop.flows.lab.bench.aggregate import bench_aggregate

    out = bench_aggregate(
        shared_data_dir / "bon" / "gsm8k_candidates.jsonl.gz", limit=40, repeats=1, calibration_size=15
    )
    assert {"vectorized_s", "naive_s", "speedup", "identical_selections"} <= set(out)
    assert out["identical_selections"] is True
    assert out["questions"] == 40
