"""The pools ``prmloop bench active`` learns from: solutions with a labeller's answer and the truth.

- ``processbench``: ProcessBench GSM8K + MATH (``../shared/data/processbench``); the labeller and the
  truth are the human first-error labels.
- ``arith``: the embedded model's own solutions to arithmetic-curriculum questions (levels 1-5 by
  default, T = 0.7, four per question, the curriculum's few-shot prompt), kept where the exact checker
  decides (a located first error, or every step verified and the answer right); the labeller and the
  truth are the checker's first errors, recomputed from the kept steps at every load.
- ``arith-mc``: a share of the ``arith`` pool's pool half labelled by the real MC annotator (adaptive
  binary search, SmolLM2 rollouts, the annotator's own pieces); each label keeps its token cost, so
  every arm replays the same labels and pays what they cost. The truth stays the checker's, and the
  held-out half is the whole ``arith`` held-out half (no rollouts spent on it).

Sampled solutions and MC labels are computed once, by the vLLM engine where it runs, else by
transformers (:class:`~prmloop.flows.pools.sampling.Sampler`, which says what it will cost
before it starts), and kept under ``$PRMLOOP_HOME/bench/active`` (append-only JSON lines, one file per
sampling settings and seed holding every level's questions ``0..n-1``, resumed where an interrupted
build stopped; a larger pool samples only the questions the cache lacks). A pool is split into a pool
half and a held-out half by a hash of the question, so no question is on both sides.
"""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from prmloop.models.prm.pool_items import PoolItem, split_pool

__all__ = ["ARITH_LEVELS", "POOLS", "PoolWork", "build_pool", "sample_arith"]

POOLS = ("processbench", "arith", "arith-mc")

Say = Callable[[str], None]


def processbench_items() -> list[PoolItem]:
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


#: How the curriculum pools are sampled: one cache file per these settings (all levels in it).
ARITH_SAMPLING: dict[str, Any] = {
    "k": 4,
    "temperature": 0.7,
    "max_new_tokens": 160,
    "prompt_format": "step_k_arith",
    "seed": 0,
}
#: The bench's curriculum levels (the retrain flow's held-out set asks for levels 1-2 of another seed).
ARITH_LEVELS = (1, 2, 3, 4, 5)
_KEPT = ("question_id", "level", "sample", "problem", "gold_answer", "steps", "answer", "correct", "tokens")


def arith_file(root: Path, sampling: dict[str, Any]) -> Path:
    settings = {k: v for k, v in sampling.items() if k != "levels"}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return root / f"arith-{digest}.jsonl"


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of an append-only cache file; a last line cut by an interrupted write is dropped
    (and cut off the file, so that what is appended next starts on a line of its own)."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def question_index(row: dict[str, Any]) -> int:
    return int(row["question_id"].rsplit("/", 1)[1])


def arith_todo(rows: list[dict[str, Any]], levels: tuple[int, ...], questions: int) -> dict[int, int]:
    """Per level, the first question not sampled yet (questions ``0..n-1`` are sampled in order)."""
    done: dict[int, int] = {}
    for row in rows:
        done[row["level"]] = max(done.get(row["level"], 0), question_index(row) + 1)
    return {level: done.get(level, 0) for level in levels if done.get(level, 0) < questions}


def tokens_per_solution(rows: list[dict[str, Any]], levels: tuple[int, ...] = ()) -> float:
    """Mean completion tokens of the cached solutions of ``levels`` (else of all, else the prior)."""
    from prmloop.flows.pools.sampling import TOKENS_PER_SOLUTION

    rows = [r for r in rows if r["level"] in levels] or rows
    return sum(r["tokens"] for r in rows) / len(rows) if rows else TOKENS_PER_SOLUTION


def sample_arith(
    root: Path, questions: int, *, sampling: dict[str, Any], work: PoolWork, say: Say
) -> list[dict[str, Any]]:
    """Sampled curriculum solutions (``questions`` per level), sampling only what the cache lacks."""
    from prmloop.flows.pools.levels import measure_arith_levels
    from prmloop.flows.pools.sampling import describe_cost, record_speed, speed

    path = arith_file(root, sampling)
    rows = read_lines(path)
    levels = tuple(sampling["levels"])
    todo = arith_todo(rows, levels, questions)
    if todo:
        k = int(sampling["k"])
        missing = sum(questions - first for first in todo.values()) * k
        sampler = work.sampler()
        rate, source = speed(root, f"{sampler.kind}.sample")
        per = tokens_per_solution(rows, tuple(todo))
        say(
            f"arith pool (seed {sampling['seed']}, levels {_span(levels)}): {missing:,} solutions to sample once "
            f"({len(todo)} level(s) x up to {questions} questions x {k}) on {sampler.note}: ~{missing * per:,.0f} "
            f"tokens at {rate:.0f} tokens/s ({source}), {describe_cost(missing * per / rate + sampler.start_seconds)}"
        )
        engine = sampler.generator()
        chunk = sampler.questions_per_call
        started, tokens, sampled, seconds = time.perf_counter(), 0, 0, 0.0
        for level, start in todo.items():
            first = start
            while first < questions:
                n = min(chunk, questions - first)
                tick = time.perf_counter()
                result = measure_arith_levels(
                    [level],
                    n_questions=n,
                    k=k,
                    max_new_tokens=int(sampling["max_new_tokens"]),
                    temperature=float(sampling["temperature"]),
                    prompt_format=sampling["prompt_format"],
                    seed=int(sampling["seed"]),
                    engine=engine,
                    first_question=first,
                    questions_per_call=chunk,
                )
                seconds += time.perf_counter() - tick
                fresh = [{**{key: r[key] for key in _KEPT}, "engine": sampler.kind} for r in result["solutions"]]
                with path.open("a") as handle:
                    handle.writelines(json.dumps(r) + "\n" for r in fresh)
                rows.extend(fresh)
                first += n
                sampled += len(fresh)
                tokens += sum(r["tokens"] for r in fresh)
                rate = tokens / max(seconds, 1e-6)
                left = (missing - sampled) * (tokens / sampled) / rate
                say(
                    f"arith pool: level {level} {first}/{questions} questions; {sampled:,}/{missing:,} solutions, "
                    f"{rate:.0f} tokens/s, {time.perf_counter() - started:.0f}s so far, {describe_cost(left)} left"
                )
        record_speed(root, f"{sampler.kind}.sample", tokens / max(seconds, 1e-6))
    kept: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:  # two builds at once may both have appended a question: the first copy counts
        if r["level"] in levels and question_index(r) < questions:
            kept.setdefault((r["question_id"], r["sample"]), r)
    return list(kept.values())


def _span(levels: tuple[int, ...]) -> str:
    return (
        f"{levels[0]}-{levels[-1]}" if levels == tuple(range(levels[0], levels[-1] + 1)) else ",".join(map(str, levels))
    )


@functools.lru_cache(maxsize=4096)
def _chain(question_id: str) -> Any:
    from prmloop.models.arith import generate_question

    _, level, seed, index = question_id.split("/")
    return generate_question(int(level.removeprefix("L")), int(seed), int(index)).chain


def decided(row: dict[str, Any]) -> int | None:
    """The checker's first error (-1: none) where it decides, else ``None``: run on the kept steps at
    every load (milliseconds), so the truth follows the checker, not the checker of the sampling day."""
    from prmloop.models.arith import check_steps

    if not row["steps"]:
        return None
    check = check_steps(_chain(row["question_id"]), row["steps"])
    if check.status != "exact":
        return None
    if check.first_error_step is None:
        return -1 if row["correct"] else None
    return int(check.first_error_step)


def _arith(root: Path, questions: int, *, sampling: dict[str, Any], work: PoolWork, say: Say) -> list[PoolItem]:
    items = []
    for row in sample_arith(root, questions, sampling=sampling, work=work, say=say):
        truth = decided(row)
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


def mc_file(root: Path, sampling: dict[str, Any]) -> Path:
    """The MC labels' cache: keyed by the labeller's settings and the sampled solutions they label."""
    settings = {"mc": MC_SETTINGS, "solutions": arith_file(root, sampling).stem}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return root / f"arith-mc-{digest}.jsonl"


def mc_chosen(items: list[PoolItem], limit: int) -> tuple[list[PoolItem], list[PoolItem]]:
    """(the first ``limit`` pool-half items in a fixed shuffled order, the held-out half)."""
    import random

    pool_half, held_out = split_pool(items)
    chosen = sorted(pool_half, key=lambda i: i.key)
    random.Random(0).shuffle(chosen)
    return chosen[:limit], held_out


def _mc_labels(
    root: Path, items: list[PoolItem], limit: int, *, sampling: dict[str, Any], work: PoolWork, say: Say
) -> list[PoolItem]:
    """The first ``limit`` pool-half items of ``items`` (in a fixed shuffled order) labelled by the MC
    annotator, and every held-out-half item, whose exact first error is what the arms are scored on
    (rollouts spent on the held-out half would be wasted)."""
    from prmloop.consumers.annotator import AnnotatorSettings, build_annotator
    from prmloop.flows.pools.sampling import MC_TOKENS_PER_SOLUTION, describe_cost, record_speed, speed
    from prmloop.models.annotation.strategies import SolutionToLabel, annotate

    path = mc_file(root, sampling)
    known = {r["key"]: r for r in read_lines(path)}
    chosen, held_out = mc_chosen(items, limit)
    todo = [i for i in chosen if i.key not in known]
    if todo:
        from concurrent.futures import ThreadPoolExecutor

        sampler = work.sampler()
        rate, source = speed(root, f"{sampler.kind}.mc")
        per = statistics.fmean(r["tokens"] for r in known.values()) if known else MC_TOKENS_PER_SOLUTION
        say(
            f"arith-mc pool: {len(todo)} of {len(chosen)} solutions to label once with MC rollouts on {sampler.note}: "
            f"~{len(todo) * per:,.0f} tokens at {rate:.0f} tokens/s ({source}), "
            f"{describe_cost(len(todo) * per / rate + sampler.start_seconds)}"
        )
        settings = AnnotatorSettings(
            **MC_SETTINGS, **sampler.annotator_options(), prompt_format="step_k_arith", in_flight=4
        )
        strategy = settings.make_strategy()
        _, completers, _, checker = build_annotator(settings)
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
                "engine": sampler.kind,
            }

        # Four solutions in flight: their rollouts reach the engine together (continuous batching on
        # vLLM, one batch through the CoalescingGenerator on transformers).
        last = time.monotonic()
        with path.open("a") as handle, ThreadPoolExecutor(max_workers=settings.in_flight) as pool:
            for n, row in enumerate(pool.map(label, todo), 1):
                handle.write(json.dumps(row) + "\n")
                handle.flush()
                known[row["key"]] = row
                tokens += row["tokens"]
                if time.monotonic() - last > 15 or n == len(todo):
                    last = time.monotonic()
                    seconds = time.perf_counter() - started
                    left = (len(todo) - n) * seconds / n
                    say(
                        f"arith-mc pool: {n}/{len(todo)} labelled, {tokens:,} tokens, {tokens / seconds:.0f} tokens/s, "
                        f"{seconds:.0f}s so far, {describe_cost(left)} left"
                    )
        record_speed(root, f"{sampler.kind}.mc", tokens / max(time.perf_counter() - started, 1e-6))
    out = []
    for item in chosen:
        row = known[item.key]
        out.append(replace(item, label_first_error=row["first_error"], cost=float(row["tokens"])))
    return out + [replace(item, label_first_error=item.first_error, cost=0.0) for item in held_out]


def _gold(item: PoolItem) -> str:
    from prmloop.models.arith import generate_question

    _, level, seed, index = item.question.split("/")
    return str(generate_question(int(level.removeprefix("L")), int(seed), int(index)).answer)


class PoolWork:
    """The engine of one or more builds (:class:`~prmloop.flows.pools.sampling.Sampler`), made and
    started only when something must be sampled; ``close`` stops what it started."""

    def __init__(self, engine: str, threads: int | None, say: Say) -> None:
        self.engine, self.threads, self.say = engine, threads, say
        self._sampler: Any = None

    def sampler(self) -> Any:
        if self._sampler is None:
            from prmloop.flows.pools.sampling import Sampler

            self._sampler = Sampler(self.engine, self.threads, self.say)
        return self._sampler

    @property
    def used(self) -> str:
        """The engine that sampled (``vllm`` or ``transformers``), ``cached`` where none was started."""
        return str(self._sampler.kind) if self._sampler is not None else "cached"

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()


def build_pool(
    name: str,
    *,
    root: Path,
    arith_questions: int = 160,
    mc_limit: int = 240,
    arith_seed: int = 0,
    arith_levels: tuple[int, ...] = ARITH_LEVELS,
    threads: int | None = None,
    engine: str = "auto",
    say: Say = lambda _line: None,
    work: PoolWork | None = None,
) -> list[PoolItem]:
    """The items of pool ``name`` (see the module docstring), building what the cache lacks.

    ``arith_seed`` and ``arith_levels`` choose the curriculum's questions (another seed: other questions,
    e.g. a held-out set for questions a loop samples with seed 0). ``engine`` samples what is missing
    (:class:`~prmloop.flows.pools.sampling.Sampler`: ``auto``, ``vllm`` or ``transformers``); a
    cached pool starts none. ``work`` shares one engine between builds (its owner closes it).
    """
    if name not in POOLS:
        raise ValueError(f"unknown pool {name!r}; choose one of {', '.join(POOLS)}")
    root.mkdir(parents=True, exist_ok=True)
    if name == "processbench":
        return processbench_items()
    sampling = {**ARITH_SAMPLING, "seed": arith_seed, "levels": tuple(arith_levels)}
    own = work is None
    work = work or PoolWork(engine, threads, say)
    try:
        arith = _arith(root, arith_questions, sampling=sampling, work=work, say=say)
        if name == "arith":
            return arith
        return _mc_labels(root, arith, mc_limit, sampling=sampling, work=work, say=say)
    finally:
        if own:
            work.close()
