"""The pools ``prmloop bench active`` learns from: solutions with a labeller's answer and the truth.

- ``processbench``: ProcessBench GSM8K + MATH (``../shared/data/processbench``); the labeller and the
  truth are the human first-error labels.
- ``arith``: the embedded model's own solutions to arithmetic-curriculum questions (levels 1-3,
  T = 0.7, four per question), kept where the exact checker decides (a located first error, or every
  step verified and the answer right); the labeller and the truth are the checker's first errors.
- ``arith-mc``: a share of the ``arith`` pool's pool half labelled by the real MC annotator (adaptive
  binary search, SmolLM2 rollouts, the annotator's own pieces); each label keeps its token cost, so
  every arm replays the same labels and pays what they cost. The truth stays the checker's, and the
  held-out half is the whole ``arith`` held-out half (no rollouts spent on it).

Sampled solutions and MC labels are computed once and kept under ``$PRMLOOP_HOME/bench/active``
(append-only JSON lines, resumed where an interrupted build stopped); a pool is split into a pool half
and a held-out half by a hash of the question, so no question is on both sides.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["POOLS", "PoolItem", "build_pool", "split_pool"]

POOLS = ("processbench", "arith", "arith-mc")

Say = Callable[[str], None]


@dataclass(frozen=True)
class PoolItem:
    """One solution of a pool.

    ``first_error`` is the truth (-1: no error); ``label_first_error`` what the labeller says (-1: no
    error; ``None``: the labeller gave no label, e.g. an unresolved MC search, though it paid for it);
    ``cost`` what the label cost (1 per label, or generated tokens for MC); ``correct`` the final
    answer's grade (the question-level priority uses it); ``subset`` the ProcessBench subset or level.
    """

    key: str
    question: str
    subset: str
    problem: str
    steps: tuple[str, ...]
    first_error: int
    label_first_error: int | None
    cost: float
    correct: bool | None
    answer: str | None = None


def split_pool(items: list[PoolItem]) -> tuple[list[PoolItem], list[PoolItem]]:
    """(pool half, held-out half) by the SHA-256 of each question: one question never straddles them."""
    pool: list[PoolItem] = []
    held_out: list[PoolItem] = []
    for item in items:
        bucket = int(hashlib.sha256(item.question.encode()).hexdigest()[:8], 16) % 2
        (pool if bucket == 0 else held_out).append(item)
    return pool, held_out


def _processbench() -> list[PoolItem]:
    from prmloop.models.processbench import read_processbench
    from prmloop.models.questions import data_dir

    items: list[PoolItem] = []
    for subset in ("gsm8k", "math"):
        rows, _ = read_processbench(data_dir() / "processbench" / f"{subset}.json")
        for row in rows:
            question = hashlib.sha256(" ".join(row.problem.split()).encode()).hexdigest()[:16]
            items.append(
                PoolItem(
                    key=f"processbench/{row.key}",
                    question=f"processbench/{question}",
                    subset=subset,
                    problem=row.problem,
                    steps=tuple(row.steps),
                    first_error=row.label,
                    label_first_error=row.label,
                    cost=1.0,
                    correct=row.final_answer_correct,
                )
            )
    return items


#: How the curriculum pool is sampled (part of its cache file's name).
ARITH_SAMPLING: dict[str, Any] = {"levels": (1, 2, 3), "k": 4, "temperature": 0.7, "max_new_tokens": 160, "seed": 0}


def _arith_file(root: Path, sampling: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(sampling, sort_keys=True).encode()).hexdigest()[:10]
    return root / f"arith-{digest}.jsonl"


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of an append-only cache file; a last line cut by an interrupted write is dropped
    (and cut off the file, so that what is appended next starts on a line of its own)."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _sample_arith(
    root: Path, questions: int, *, sampling: dict[str, Any], threads: int | None, say: Say, engine: list[Any]
) -> list[dict[str, Any]]:
    """Sampled curriculum solutions (``questions`` per level), sampling only what the cache lacks."""
    from prmloop.flows.evals.arith import measure_arith_levels

    path = _arith_file(root, sampling)
    rows = _read_lines(path)
    done: dict[int, int] = {}
    for row in rows:
        done[row["level"]] = max(done.get(row["level"], 0), int(row["question_id"].rsplit("/", 1)[1]) + 1)
    chunk = 8
    for level in sampling["levels"]:
        while done.get(level, 0) < questions:
            first = done.get(level, 0)
            if engine[0] is None:
                say("sampling curriculum solutions with the embedded SmolLM2 (once; kept in the cache)")
                from prmloop.models.backends.registry import BackendConfig, build_backend

                options = {"num_threads": threads} if threads else {}
                engine[0] = build_backend(BackendConfig(backend="transformers", model="smollm2", options=options))
            tick = time.perf_counter()
            result = measure_arith_levels(
                [level],
                n_questions=min(chunk, questions - first),
                k=int(sampling["k"]),
                max_new_tokens=int(sampling["max_new_tokens"]),
                temperature=float(sampling["temperature"]),
                seed=int(sampling["seed"]),
                engine=engine[0],
                first_question=first,
                questions_per_call=4,
            )
            fresh = [
                {
                    k: r[k]
                    for k in (
                        "question_id",
                        "level",
                        "sample",
                        "problem",
                        "gold_answer",
                        "steps",
                        "answer",
                        "correct",
                        "check_status",
                        "first_error_step",
                        "tokens",
                    )
                }
                for r in result["solutions"]
            ]
            with path.open("a") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in fresh)
            rows.extend(fresh)
            done[level] = first + min(chunk, questions - first)
            say(
                f"arith pool: level {level}, {done[level]}/{questions} questions sampled "
                f"({len(fresh)} solutions in {time.perf_counter() - tick:.0f}s)"
            )
    wanted = {(lvl, i) for lvl in sampling["levels"] for i in range(questions)}
    return [r for r in rows if (r["level"], int(r["question_id"].rsplit("/", 1)[1])) in wanted]


def _decided(row: dict[str, Any]) -> int | None:
    """The checker's first error (-1: none) where it decides, else ``None``."""
    if row["check_status"] != "exact" or not row["steps"]:
        return None
    if row["first_error_step"] is None:
        return -1 if row["correct"] else None
    return int(row["first_error_step"])


def _arith(
    root: Path, questions: int, *, sampling: dict[str, Any], threads: int | None, say: Say, engine: list[Any]
) -> list[PoolItem]:
    items = []
    for row in _sample_arith(root, questions, sampling=sampling, threads=threads, say=say, engine=engine):
        truth = _decided(row)
        if truth is None:
            continue
        items.append(
            PoolItem(
                key=f"{row['question_id']}/{row['sample']}",
                question=row["question_id"],
                subset=f"L{row['level']}",
                problem=row["problem"],
                steps=tuple(row["steps"]),
                first_error=truth,
                label_first_error=truth,
                cost=1.0,
                correct=bool(row["correct"]),
                answer=row["answer"],
            )
        )
    return items


#: The MC labeller of ``arith-mc``: the demo's laptop settings of the annotator (adaptive binary search).
MC_SETTINGS: dict[str, Any] = {
    "strategy": "adaptive_binary",
    "n0": 4,
    "n_min": 2,
    "n_max": 8,
    "max_new_tokens": 128,
    "seed": 0,
}


def _mc_labels(root: Path, items: list[PoolItem], limit: int, *, threads: int | None, say: Say) -> list[PoolItem]:
    """The first ``limit`` pool-half items of ``items`` (in a fixed shuffled order) labelled by the MC
    annotator, and every held-out-half item, whose exact first error is what the arms are scored on
    (rollouts spent on the held-out half would be wasted)."""
    import random

    from prmloop.consumers.annotator import AnnotatorSettings, build_annotator
    from prmloop.models.annotation.strategies import SolutionToLabel, annotate

    digest = hashlib.sha256(json.dumps(MC_SETTINGS, sort_keys=True).encode()).hexdigest()[:10]
    path = root / f"arith-mc-{digest}.jsonl"
    known = {r["key"]: r for r in _read_lines(path)}
    pool_half, held_out = split_pool(items)
    chosen = sorted(pool_half, key=lambda i: i.key)
    random.Random(0).shuffle(chosen)
    chosen = chosen[:limit]
    todo = [i for i in chosen if i.key not in known]
    if todo:
        from concurrent.futures import ThreadPoolExecutor

        settings = AnnotatorSettings(
            **MC_SETTINGS,
            threads=threads,
            prompt_format="step_k_arith",
            in_flight=4,
        )
        strategy = settings.make_strategy()
        _, completers, _, checker = build_annotator(settings)
        say(f"arith-mc pool: labelling {len(todo)} of {len(chosen)} solutions with MC rollouts (once; cached)")
        started, tokens = time.perf_counter(), 0

        def label(item: PoolItem) -> dict[str, Any]:
            solution = SolutionToLabel(item.problem, item.steps, _gold(item), bool(item.correct))
            result = annotate(solution, strategy, completers, checker=checker)
            first = None
            if result.status == "all_correct":
                first = -1
            elif result.status == "labelled":
                first = -1 if result.first_error_step is None else result.first_error_step
            return {
                "key": item.key,
                "status": result.status,
                "first_error": first,
                "tokens": result.cost.generated_tokens,
                "rollouts": result.cost.rollouts,
            }

        # Four solutions in flight: their rollouts reach the engine as one batch (CoalescingGenerator).
        with path.open("a") as handle, ThreadPoolExecutor(max_workers=settings.in_flight) as pool:
            for n, row in enumerate(pool.map(label, todo), 1):
                handle.write(json.dumps(row) + "\n")
                handle.flush()
                known[row["key"]] = row
                tokens += row["tokens"]
                if n % 10 == 0 or n == len(todo):
                    seconds = time.perf_counter() - started
                    say(f"arith-mc pool: {n}/{len(todo)} labelled, {tokens} tokens, {seconds:.0f}s")
    out = []
    for item in chosen:
        row = known[item.key]
        out.append(
            PoolItem(
                key=item.key,
                question=item.question,
                subset=item.subset,
                problem=item.problem,
                steps=item.steps,
                first_error=item.first_error,
                label_first_error=row["first_error"],
                cost=float(row["tokens"]),
                correct=item.correct,
                answer=item.answer,
            )
        )
    return out + [replace(item, label_first_error=item.first_error, cost=0.0) for item in held_out]


def _gold(item: PoolItem) -> str:
    from prmloop.models.arith import generate_question

    _, level, seed, index = item.question.split("/")
    return str(generate_question(int(level.removeprefix("L")), int(seed), int(index)).answer)


def build_pool(
    name: str,
    *,
    root: Path,
    arith_questions: int = 160,
    mc_limit: int = 240,
    arith_seed: int = 0,
    arith_levels: tuple[int, ...] = (1, 2, 3),
    threads: int | None = None,
    say: Say = lambda _line: None,
) -> list[PoolItem]:
    """The items of pool ``name`` (see the module docstring), building what the cache lacks.

    ``arith_seed`` and ``arith_levels`` choose the curriculum's questions (another seed: other questions,
    e.g. a held-out set for questions a loop samples with seed 0).
    """
    root.mkdir(parents=True, exist_ok=True)
    engine: list[Any] = [None]
    sampling = {**ARITH_SAMPLING, "seed": arith_seed, "levels": tuple(arith_levels)}
    if name == "processbench":
        return _processbench()
    arith = _arith(root, arith_questions, sampling=sampling, threads=threads, say=say, engine=engine)
    if name == "arith":
        return arith
    if name == "arith-mc":
        return _mc_labels(root, arith, mc_limit, threads=threads, say=say)
    raise ValueError(f"unknown pool {name!r}; choose one of {', '.join(POOLS)}")
