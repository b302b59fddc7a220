"""The test set: solutions nothing trains or promotes on, the same on every machine.

Three sets never mix (ARCHITECTURE.md, "How learning is scored"): the labels the loop accepts
(training), the validation set promotion is decided on (:func:`prmloop.flows.retrain_ensemble.eval_items`,
curriculum seed 1000), and this test set, on which every figure a user sees is scored. It is the
embedded model's own solutions to curriculum questions of a reserved seed (:data:`TEST_SEED`, which
neither the loop nor the validation set samples), levels 1-5, sampled as the loop samples
(:data:`~prmloop.flows.pools.build.ARITH_SAMPLING`), kept where the exact checker decides, each with the
checker's first error.

For the embedded generator the set ships in the repository (``flows/pools/testsets/``): a gzipped JSON
lines file and a manifest naming the generator and its digest, the sampling settings, the checker, the
counts per level and the file's SHA-256. ``prmloop testset build`` makes it on the engine. For another
generator (its digest differs) the set is built at first use and cached under
``$PRMLOOP_HOME/testsets``, saying first what that costs (:func:`prmloop.flows.pools.build.build_pool`).

Scoring a PRM on 1,500 solutions needs the backbone's step features of each (a forward pass: minutes
on two cores beside the engine). So the shipped set carries them too, for the default
:class:`~prmloop.models.prm.features.FeatureSpec` (``<stem>.features-<digest>.npz``, float16 as the
feature cache stores them): :func:`seed_features` puts them into a home's cache when the cache's
digest (backbone weights, spec, feature version) is the file's, and any other spec computes its own.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prmloop.models.prm.pool_items import PoolItem

__all__ = [
    "CHECKER",
    "SHIPPED_DIR",
    "TESTSET_VERSION",
    "TEST_LEVELS",
    "TEST_QUESTIONS",
    "TEST_SEED",
    "TestSetError",
    "build_testset",
    "load_testset",
    "read_manifest",
    "seed_features",
    "seed_in",
    "test_items",
    "write_features",
]

Say = Callable[[str], None]

#: The curriculum seed reserved for the test set (the loop samples seed 0 by default, validation 1000).
TEST_SEED = 2000
#: Curriculum levels of the test set.
TEST_LEVELS = (1, 2, 3, 4, 5)
#: Questions per level sampled for the shipped set (4 solutions each; about 80 % are decided).
TEST_QUESTIONS = 100
#: Bump when what a test set holds changes (a file of another version is not read).
TESTSET_VERSION = 1
#: How the truth was decided: :func:`prmloop.flows.pools.build.decided` (the exact checker's first
#: error on the kept steps, the answer's grade for "no error").
CHECKER = {"function": "prmloop.flows.pools.build.decided", "strictness": "equations", "version": 1}
#: Where the embedded generator's test set ships.
SHIPPED_DIR = Path(__file__).resolve().parent / "testsets"


class TestSetError(ValueError):
    """A test set that cannot be read as it should (digest, version): one line saying what to do."""

    __test__ = False  # not a pytest class


_PREFIX = "arith-smollm2-seed"


def _stem(seed: int) -> str:
    return f"{_PREFIX}{seed}-v{TESTSET_VERSION}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_testset(
    out_dir: Path,
    *,
    questions: int = TEST_QUESTIONS,
    seed: int = TEST_SEED,
    levels: tuple[int, ...] = TEST_LEVELS,
    engine: str = "auto",
    cache: Path | None = None,
    threads: int | None = None,
    say: Say = lambda _line: None,
) -> dict[str, Any]:
    """Sample the test set on ``engine`` (what the cache under ``cache`` lacks), keep what the checker
    decides, write ``<stem>.jsonl.gz`` and ``<stem>.manifest.json`` into ``out_dir``; the manifest."""
    from prmloop.flows.pools.build import ARITH_SAMPLING, PoolWork, decided, sample_arith
    from prmloop.models.prm.features import backbone_digest
    from prmloop.store.settings import StateSettings

    cache = cache or StateSettings().home / "testsets" / "samples"
    cache.mkdir(parents=True, exist_ok=True)
    sampling = {**ARITH_SAMPLING, "seed": seed, "levels": tuple(levels)}
    started = time.monotonic()
    work = PoolWork(engine, threads, say)
    try:
        rows = sample_arith(cache, questions, sampling=sampling, work=work, say=say)
        engine_used = work.used
    finally:
        work.close()
    kept: list[dict[str, Any]] = []
    per_level: dict[str, Counter[str]] = {}
    for row in sorted(rows, key=lambda r: (r["level"], r["question_id"], r["sample"])):
        counts = per_level.setdefault(f"L{row['level']}", Counter())
        counts["sampled"] += 1
        truth = decided(row)
        if truth is None:
            continue
        counts["decided"] += 1
        counts["erroneous" if truth >= 0 else "correct"] += 1
        kept.append(
            {
                "key": f"{row['question_id']}/{row['sample']}",
                "question_id": row["question_id"],
                "level": row["level"],
                "problem": row["problem"],
                "steps": row["steps"],
                "answer": row["answer"],
                "correct": bool(row["correct"]),
                "first_error": truth,
                "tokens": row["tokens"],
            }
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / f"{_stem(seed)}.jsonl.gz"
    # mtime=0: the same solutions give the same bytes, so the digest names the content alone.
    with gzip.GzipFile(data, "wb", mtime=0) as handle:
        handle.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept).encode())
    manifest = {
        "version": TESTSET_VERSION,
        "file": data.name,
        "sha256": _sha256(data),
        "generator": {"name": "smollm2", "digest": backbone_digest("smollm2"), "engine": engine_used},
        "sampling": {**{k: v for k, v in sampling.items() if k != "levels"}, "levels": list(levels)},
        "questions_per_level": questions,
        "checker": CHECKER,
        "solutions": len(kept),
        "per_level": {level: dict(counts) for level, counts in sorted(per_level.items())},
        "generated_tokens": sum(int(r["tokens"]) for r in rows),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_seconds": round(time.monotonic() - started, 1),
        "command": f"prmloop testset build --questions {questions} --seed {seed}",
    }
    (out_dir / f"{_stem(seed)}.manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"test set: {len(kept):,} decided solutions of {len(rows):,} sampled, written to {data}")
    return manifest


def read_manifest(directory: Path = SHIPPED_DIR, seed: int = TEST_SEED) -> dict[str, Any] | None:
    """The manifest of the test set of ``seed`` in ``directory`` (``None``: there is none)."""
    path = directory / f"{_stem(seed)}.manifest.json"
    if not path.is_file():
        return None
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def seed_in(directory: Path) -> int:
    """The curriculum seed of the test set in ``directory``: the reserved test seed where that set is
    there (the shipped folder also holds the validation set), else the folder's only set."""
    suffix = f"-v{TESTSET_VERSION}.manifest.json"
    names = [p.name[len(_PREFIX) : -len(suffix)] for p in directory.glob(f"{_PREFIX}*{suffix}")]
    seeds = sorted(int(n) for n in names if n.isdigit())
    if TEST_SEED in seeds:
        return TEST_SEED
    if len(seeds) == 1:
        return seeds[0]
    if not seeds:
        raise TestSetError(f"no test set in {directory}: build one with `prmloop testset build --out {directory}`")
    raise TestSetError(f"{directory} holds test sets of seeds {seeds}: pass --seed to choose one")


def load_testset(directory: Path = SHIPPED_DIR, seed: int = TEST_SEED) -> tuple[dict[str, Any], list[PoolItem]]:
    """(manifest, items) of the test set in ``directory``, its digest checked."""
    manifest = read_manifest(directory, seed)
    if manifest is None:
        raise TestSetError(
            f"no test set of seed {seed} in {directory}: build one with `prmloop testset build --out {directory}`"
        )
    if manifest.get("version") != TESTSET_VERSION:
        raise TestSetError(
            f"{directory}: test set version {manifest.get('version')} is not {TESTSET_VERSION}: "
            "build it again with `prmloop testset build`"
        )
    data = directory / manifest["file"]
    if not data.is_file() or _sha256(data) != manifest["sha256"]:
        raise TestSetError(
            f"{data}: missing or its SHA-256 is not the manifest's: restore it from git or build it again "
            "with `prmloop testset build`"
        )
    with gzip.open(data, "rt") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    items = [
        PoolItem(
            key=r["key"],
            question=r["question_id"],
            subset=f"L{r['level']}",
            problem=r["problem"],
            steps=tuple(r["steps"]),
            first_error=int(r["first_error"]),
            label_first_error=int(r["first_error"]),
            cost=1.0,
            correct=bool(r["correct"]),
            answer=r["answer"],
        )
        for r in rows
    ]
    return manifest, items


def test_items(
    *, engine: str = "auto", threads: int | None = None, say: Say = lambda _line: None
) -> tuple[dict[str, Any], list[PoolItem]]:
    """The embedded generator's test set: the shipped one where its digest is the installed model's,
    else one built now (saying first what it costs) and cached under ``$PRMLOOP_HOME/testsets``."""
    from prmloop.models.prm.features import backbone_digest
    from prmloop.store.settings import StateSettings

    digest = backbone_digest("smollm2")
    shipped = read_manifest()
    if shipped is not None and shipped["generator"]["digest"] == digest:
        return load_testset()
    own = StateSettings().home / "testsets" / digest[:12]
    if read_manifest(own) is None:
        made_by = shipped["generator"]["digest"][:12] if shipped else "none shipped"
        say(
            f"test set: the installed generator ({digest[:12]}) is not the shipped set's ({made_by}); "
            f"building its own once into {own}"
        )
        build_testset(own, engine=engine, threads=threads, say=say)
    return load_testset(own)


def _features_name(seed: int, digest: str) -> str:
    return f"{_stem(seed)}.features-{digest[:12]}.npz"


def write_features(
    directory: Path = SHIPPED_DIR,
    *,
    seed: int = TEST_SEED,
    spec: Any = None,
    threads: int | None = None,
    say: Say = lambda _line: None,
) -> dict[str, Any]:
    """Compute the test set's step features (``spec``: the default) and write them beside it; the
    manifest gains a ``features`` entry. Returns that entry."""
    import numpy as np

    from prmloop.models.prm.features import FeatureExtractor, FeatureSpec, solution_key, spec_digest

    spec = spec or FeatureSpec()
    manifest, items = load_testset(directory, seed)
    digest = spec_digest(spec)
    extractor = FeatureExtractor(spec, threads=threads)
    started = time.monotonic()
    arrays: list[Any] = []
    for start in range(0, len(items), 32):
        part = items[start : start + 32]
        arrays += extractor.extract([i.problem for i in part], [list(i.steps) for i in part])
        if start // 32 % 10 == 0 or start + 32 >= len(items):
            say(f"test set features: {min(start + 32, len(items))}/{len(items)} in {time.monotonic() - started:.0f}s")
    keys = np.asarray([solution_key(i.problem, i.steps) for i in items])
    rows = np.asarray([a.shape[0] for a in arrays], dtype=np.int32)
    data = np.concatenate([a.astype(np.float16) for a in arrays]) if arrays else np.zeros((0, 0), np.float16)
    path = directory / _features_name(seed, digest)
    with path.open("wb") as handle:
        np.savez_compressed(handle, keys=keys, rows=rows, data=data)
    entry = {"file": path.name, "sha256": _sha256(path), "spec_digest": digest, "spec": spec.model_dump(mode="json")}
    manifest["features"] = entry
    (directory / f"{_stem(seed)}.manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return entry


def seed_features(cache: Any, directory: Path = SHIPPED_DIR, seed: int = TEST_SEED) -> int:
    """Put the shipped test set's features into ``cache`` (a :class:`~prmloop.models.prm.features.FeatureCache`)
    where its digest is theirs; the number of solutions added (0: another spec, or already there)."""
    import numpy as np

    manifest = read_manifest(directory, seed)
    entry = (manifest or {}).get("features")
    if not entry or entry.get("spec_digest") != cache.digest:
        return 0
    path = directory / entry["file"]
    if not path.is_file() or _sha256(path) != entry["sha256"]:
        return 0
    with np.load(path) as found:
        keys, rows, data = list(found["keys"]), found["rows"], found["data"]
    present = cache.get(keys)
    starts = np.concatenate([[0], np.cumsum(rows)])
    missing = {str(k): data[starts[i] : starts[i + 1]] for i, k in enumerate(keys) if str(k) not in present}
    if missing:
        cache.put(missing)
    return len(missing)
