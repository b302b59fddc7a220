"""Load a Best-of-N pool file and a PRM step-score file into a :class:`CandidatePool`: answers are
grouped by mathematical equivalence and clusters graded against the reference answers (once; the
result is cached under the user cache directory, never in the repository)."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from prmloop.models.aggregation.methods import NO_ANSWER
from prmloop.models.aggregation.pool import CandidatePool, ScoreKind

logger = logging.getLogger(__name__)

KNOWN_SCORE_KINDS: dict[str, ScoreKind] = {
    "qwen_prm": "probability",
    "math_shepherd": "probability",
    "skywork_prm_1_5b": "probability",
    # An outcome reward model: its scores rank solutions but are not probabilities of correctness
    # (MANIFEST.md); in these files they were squashed into (0, 1), which must not be mistaken for
    # probabilities.
    "internlm2_1_8b_reward": "reward",
}
"""Score kind of the reward models in ``../shared/data/bon/step_scores``. A PRM not listed is
``probability`` when all its scores lie in [0, 1], else ``reward``; pass ``score_kind`` to override."""

CACHE_ENV = "PRMLOOP_CACHE_DIR"
GROUPING_CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$PRMLOOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/prmloop``, else ``~/.cache/prmloop``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prmloop"


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{path}:{lineno} is not valid JSON ({exc.msg}); is this a JSONL pool file?"
                    ) from exc
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"pool file {path} does not exist (see ../shared/data/MANIFEST.md)") from exc
    except gzip.BadGzipFile as exc:
        raise ValueError(f"{path} ends in .gz but is not gzip data") from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_reference_answers(path: Path, questions: list[str], *, prefix: bool = False) -> list[str]:
    """Gold answers from a MATH-style JSONL file (``{problem, answer}``) in the pool's order; every
    problem text must match, so a wrong or reordered file is refused. ``prefix``: the pool holds
    only the first questions of the file (``load_pool(limit=...)``)."""
    rows = list(_read_jsonl(path))
    if prefix:
        rows = rows[: len(questions)]
    if len(rows) != len(questions):
        raise ValueError(f"reference file {path} has {len(rows)} rows but the pool has {len(questions)} questions")
    gold = []
    for i, (row, question) in enumerate(zip(rows, questions, strict=True)):
        if "answer" not in row or "problem" not in row:
            raise ValueError(f"{path} row {i} lacks 'problem' or 'answer'; expected math500_test.jsonl rows")
        if row["problem"].strip() != question.strip():
            raise ValueError(f"{path} row {i} is a different problem than pool question {i}; the files must align")
        gold.append(str(row["answer"]))
    return gold


def group_and_grade(
    answers: list[list[str | None]], gold: list[str], *, timeout_s: float = 5.0
) -> tuple[list[list[int]], list[list[bool]]]:
    """Cluster ids per candidate (``-1`` for no answer) and correctness per cluster, per question.

    Uses :func:`prmloop.models.grading.group_equivalent_answers` (math-verify equivalence, ids in
    first-seen order) and grades each cluster's first member with :func:`prmloop.models.grading.grade`.
    """
    from prmloop.models import grading

    all_ids: list[list[int]] = []
    all_ok: list[list[bool]] = []
    for row, g in zip(answers, gold, strict=True):
        present = [a for a in row if a is not None and a.strip()]
        ids_present = grading.group_equivalent_answers(present, timeout_s=timeout_s) if present else []
        it = iter(ids_present)
        ids = [next(it) if a is not None and a.strip() else NO_ANSWER for a in row]
        reps: dict[int, str] = {}
        for a, k in zip(present, ids_present, strict=True):
            reps.setdefault(k, a)
        ok = [grading.grade(reps[k], g, timeout_s=timeout_s).is_correct for k in range(len(reps))]
        all_ids.append(ids)
        all_ok.append(ok)
    return all_ids, all_ok


def load_pool(
    candidates_path: str | Path,
    scores_path: str | Path,
    *,
    reference_path: str | Path | None = None,
    score_kind: ScoreKind | None = None,
    cache_dir: str | Path | None = None,
    limit: int | None = None,
) -> CandidatePool:
    """Read a pool (``bon/*_candidates.jsonl.gz``) and its PRM step scores (``bon/step_scores/*``).

    Args:
        candidates_path: one line per problem ``{problem_id, candidates[N]}`` (MANIFEST.md).
        scores_path: one line per candidate ``{prm_name, problem_id, candidate_index, step_scores}``.
        reference_path: gold answers to grade against instead of the pool's ``ground_truth``
            (``math/math500_test.jsonl`` for MATH-500, whose stored correctness is wrong for about 150
            problems). MATH-500 pools are refused without it.
        score_kind: override :data:`KNOWN_SCORE_KINDS` / the range check.
        cache_dir: where the grouping/grading cache lives (default :func:`default_cache_dir`).
        limit: keep only the first ``limit`` questions (for tests).
    """
    cpath, spath = Path(candidates_path), Path(scores_path)
    problems = list(_read_jsonl(cpath))
    if limit is not None:
        problems = problems[:limit]
    if not problems:
        raise ValueError(f"{cpath} holds no problems")
    for i, p in enumerate(problems):
        if "problem_id" not in p or not isinstance(p.get("candidates"), list):
            raise ValueError(f"{cpath} line {i + 1} lacks problem_id/candidates; is this a bon/*_candidates file?")
    n = len(problems[0]["candidates"])
    if any(len(p["candidates"]) != n for p in problems):
        raise ValueError(f"{cpath}: problems have different numbers of candidates; expected N={n} for all")
    qids = [str(p["problem_id"]) for p in problems]
    first = problems[0]["candidates"][0]
    dataset = str(first.get("problem", {}).get("dataset") or qids[0].rsplit("_", 1)[0])
    generators = {str(c.get("model_name", "unknown")) for p in problems for c in p["candidates"]}
    generator = generators.pop() if len(generators) == 1 else "mixed"
    questions = [str(p["candidates"][0]["problem"]["question"]) for p in problems]
    answers = [[c.get("extracted_answer") for c in p["candidates"]] for p in problems]
    stored_ok = np.array([[bool(c.get("is_correct")) for c in p["candidates"]] for p in problems])

    if reference_path is not None:
        gold = read_reference_answers(Path(reference_path), questions, prefix=limit is not None)
        gold_source = _sha256(Path(reference_path))
    else:
        if dataset == "math500":
            raise ValueError(
                "the MATH-500 pool's stored ground truth is wrong for about 150 problems: pass "
                "reference_path=../shared/data/math/math500_test.jsonl to re-grade against it"
            )
        gold = [str(p["candidates"][0]["problem"]["ground_truth"]) for p in problems]
        gold_source = "pool"

    ids, cluster_ok = _cached_grouping(
        cpath, gold_source=gold_source, limit=limit, answers=answers, gold=gold, cache_dir=cache_dir
    )
    ans = np.array(ids, dtype=np.int64)
    correct = np.array(
        [[k != NO_ANSWER and ok[k] for k in row] for row, ok in zip(ids, cluster_ok, strict=True)], dtype=bool
    )

    step_scores, n_steps, prm_name = _read_step_scores(spath, qids, n)
    if score_kind is None:
        finite = step_scores[np.isfinite(step_scores)]
        in_unit = bool(finite.size) and finite.min() >= 0.0 and finite.max() <= 1.0
        score_kind = KNOWN_SCORE_KINDS.get(prm_name, "probability" if in_unit else "reward")
    disagree = int((correct != stored_ok).sum())
    if disagree:
        logger.info("%s: re-grading changed the correctness of %d of %d candidates", cpath.name, disagree, ans.size)
    return CandidatePool(
        question_ids=tuple(qids),
        answers=ans,
        correct=correct,
        step_scores=step_scores,
        n_steps=n_steps,
        generator=generator,
        prm_name=prm_name,
        dataset=dataset,
        score_kind=score_kind,
    )


def _read_step_scores(path: Path, qids: list[str], n: int) -> tuple[np.ndarray, np.ndarray, str]:
    row_of = {q: i for i, q in enumerate(qids)}
    found: dict[tuple[int, int], list[float]] = {}
    names: set[str] = set()
    for rec in _read_jsonl(path):
        try:
            q, i, steps = rec["problem_id"], int(rec["candidate_index"]), rec["step_scores"]
        except KeyError as exc:
            raise ValueError(f"{path}: a record lacks {exc}; is this a bon/step_scores file?") from exc
        names.add(str(rec.get("prm_name", "unknown")))
        if q in row_of:
            if not 0 <= i < n:
                raise ValueError(f"{path}: candidate_index {i} of {q} is outside the pool's 0..{n - 1}")
            found[(row_of[q], i)] = [float(s) for s in steps]
    missing = [(qids[q], i) for q in range(len(qids)) for i in range(n) if (q, i) not in found]
    if missing:
        raise ValueError(
            f"{path} has no step scores for {len(missing)} candidates of the pool (first: {missing[0]}); "
            "is it the score file of this pool?"
        )
    if len(names) != 1:
        raise ValueError(f"{path} mixes reward models {sorted(names)}; give one file per PRM")
    width = max(len(v) for v in found.values())
    scores = np.full((len(qids), n, max(width, 1)), np.nan)
    n_steps = np.zeros((len(qids), n), dtype=np.int64)
    for (q, i), v in found.items():
        scores[q, i, : len(v)] = v
        n_steps[q, i] = len(v)
    return scores, n_steps, names.pop()


def _cached_grouping(
    cpath: Path,
    *,
    gold_source: str,
    limit: int | None,
    answers: list[list[str | None]],
    gold: list[str],
    cache_dir: str | Path | None,
) -> tuple[list[list[int]], list[list[bool]]]:
    from prmloop.models import grading

    grader_sha = _sha256(Path(grading.__file__))
    key_src = json.dumps([GROUPING_CACHE_VERSION, _sha256(cpath), gold_source, limit, grader_sha])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    cdir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cfile = cdir / "aggregation" / f"grouping-{cpath.name.split('.')[0]}-{key}.json"
    if cfile.exists():
        try:
            data = json.loads(cfile.read_text())
            return data["ids"], data["cluster_correct"]
        except (json.JSONDecodeError, KeyError):
            logger.warning("ignoring unreadable grouping cache %s", cfile)
    logger.info("grouping and grading %d x %d answers (cached in %s)", len(answers), len(answers[0]), cfile)
    ids, ok = group_and_grade(answers, gold)
    cfile.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfile.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ids": ids, "cluster_correct": ok}))
    tmp.replace(cfile)
    return ids, ok


def resolve_pool_paths(
    pool: str | Path, scores: str | Path | None = None, prm: str = "qwen_prm", reference: str | Path | None = None
) -> tuple[Path, Path, Path | None]:
    """Pool file, score file and reference file for ``pool``.

    ``scores`` defaults to ``step_scores/{prm}_{dataset}.jsonl.gz`` beside the pool, where
    ``dataset`` is the pool file's name before ``_candidates``; ``reference`` defaults to
    ``../math/math500_test.jsonl`` for the MATH-500 pool (its stored correctness is wrong).
    """
    pool_path = Path(pool)
    dataset = pool_path.name.split("_candidates")[0]
    score_path = Path(scores) if scores is not None else pool_path.parent / "step_scores" / f"{prm}_{dataset}.jsonl.gz"
    if not score_path.exists():
        available = sorted(p.name for p in (pool_path.parent / "step_scores").glob(f"*_{dataset}.jsonl.gz"))
        raise FileNotFoundError(
            f"no step scores at {score_path}; pass --scores, or --prm with one of: {available or 'none found'}"
        )
    ref: Path | None = Path(reference) if reference is not None else None
    if ref is None and dataset == "math500":
        guess = pool_path.parent.parent / "math" / "math500_test.jsonl"
        ref = guess if guess.exists() else None
    return pool_path, score_path, ref


def load_for_eval(
    pool: str | Path,
    scores: str | Path | None = None,
    *,
    prm: str = "qwen_prm",
    reference: str | Path | None = None,
    score_kind: ScoreKind | None = None,
    limit: int | None = None,
) -> CandidatePool:
    """:func:`load_pool` with the paths of :func:`resolve_pool_paths`."""
    pool_path, score_path, ref = resolve_pool_paths(pool, scores, prm, reference)
    return load_pool(pool_path, score_path, reference_path=ref, score_kind=score_kind, limit=limit)
