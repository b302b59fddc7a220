"""``prmloop bench loop --real``: the streaming loop against the round-based one, on the same engine,
model and wall-clock budget, and the prioritizer against a random question order where it runs.

Three arms, one after the other, each in a home of its own (its own broker, sink, store and services,
as ``prmloop up`` starts them), sharing one vLLM engine (where ``make vllm`` made it ready; else
transformers in each service) and one Prefect server:

- ``streaming``: ``prmloop run`` (:mod:`prmloop.flows.loop.driver`), questions prioritized;
- ``random_order``: the same loop with questions sampled in the order they come (no probe);
- ``rounds``: the round-based loop (:mod:`prmloop.flows.lab.bench.rounds_arm`).

Each arm reports accepted labels, per minute and per thousand generated tokens, the engine's busy
fraction from its own gauge, the held-out F1 after each retrain with its time, and its final F1 next
to the F1 of an ensemble trained on the *exact* labels (the curriculum's checker) of the same
solutions. Top level: ``streaming_to_rounds_ratio`` (accepted labels per minute),
``priority_to_random_ratio`` (accepted labels per 1k tokens) and both orders' F1 at equal tokens.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prmloop.store.settings import StateSettings

__all__ = [
    "ARMS",
    "QUICK_RETRAINS",
    "bench_loop_real",
    "exact_label_f1",
    "f1_at_tokens",
    "in_process_device",
    "warm_features",
]

ARMS = ("streaming", "rounds", "random_order")
#: --quick shows the curve's mechanism, not its height: each arm ends at this many scored retrains.
QUICK_RETRAINS = 3


@contextlib.contextmanager
def _environment() -> Iterator[None]:
    """Each arm sets variables for its services; the next arm starts from the same environment."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def share_credentials(source: Path, home: Path) -> None:
    """Give ``home`` the credentials of ``source``: the arms' services, the shared engine and Prefect
    server and this process must all know the same API key and auth string."""
    import shutil

    from prmloop.store.auth.credentials import CREDENTIALS_FILE, load_credentials, secure_home

    load_credentials(source)  # made on first use
    secure_home(home)
    target = home / CREDENTIALS_FILE
    if not target.exists():
        shutil.copyfile(source / CREDENTIALS_FILE, target)
        target.chmod(0o600)


def in_process_device() -> str:
    """Where this machine's in-process models run: the PRM backbone always, every service's model when no
    engine is ready (transformers' default device: a GPU where torch sees one)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return f"cpu ({os.cpu_count()} cores)"


def f1_at_tokens(curve: list[dict[str, Any]], tokens: int) -> float | None:
    """The held-out F1 of the newest retrain that started within ``tokens`` generated tokens."""
    within = [r for r in curve if r.get("f1") is not None and r.get("tokens", 0) <= tokens]
    return within[-1]["f1"] if within else None


def warm_features(
    items: list[Any], cache_dir: Path, threads: int | None = None, *, spec: Any = None, extractor: Any = None
) -> int:
    """Compute and cache the backbone features of held-out ``items`` under ``cache_dir`` with ``spec`` (the
    retrain flow's default: what every ensemble PRM of the bench scores them with); ``extractor``: a
    callable returning the backbone (default: loaded on first need). Returns how many items it covered."""
    from prmloop.models.prm.features import FeatureCache, FeatureExtractor, FeatureSpec, cached_features

    spec = spec or FeatureSpec()
    cache_dir.mkdir(parents=True, exist_ok=True)
    backbone = extractor or (lambda: FeatureExtractor(spec, threads=threads))
    problems, steps = [i.problem for i in items], [list(i.steps) for i in items]
    return len(cached_features(problems, steps, cache=FeatureCache(cache_dir, spec), extractor=backbone))


def exact_label_f1(db: Path, eval_set: str, eval_questions: int, threads: int | None = None) -> dict[str, Any]:
    """An ensemble trained on the curriculum checker's exact labels of the arm's accepted solutions (the
    ones the checker decides), scored on the test set (with its 95 % interval; the validation F1 beside it):
    what the loop's labels could have been."""
    from prmloop.flows.retrain_ensemble import eval_items, score_on_test
    from prmloop.models.arith.checker import check_steps
    from prmloop.models.arith.verifier import chain_of
    from prmloop.models.prm.data import PRMExample
    from prmloop.models.prm.ensemble import EnsembleConfig
    from prmloop.models.prm.ensemble_prm import train_ensemble_prm
    from prmloop.models.prm.pool_items import held_out_f1
    from prmloop.store.tables.snapshot import select_labels

    rows = select_labels(db, kind="accepted")
    examples, agree = [], 0
    for row in rows:
        chain = chain_of(row.question_id)
        if chain is None:
            continue
        check = check_steps(chain, row.completions)
        if not check.exact:
            continue
        first = check.first_error_step
        labels = tuple(first is None or i < first for i in range(len(row.completions)))
        agree += labels == tuple(row.labels)
        examples.append(PRMExample(row.prompt, row.completions, labels))
    if not examples:
        return {"solutions": 0, "f1": None, "agreement": None}
    features_dir = StateSettings().features_dir
    prm, _ = train_ensemble_prm(examples, config=EnsembleConfig(threads=1), cache_dir=features_dir, threads=threads)
    held = eval_items(eval_set, limit=eval_questions, threads=threads)
    features = dict(
        zip([i.key for i in held], prm.features([i.problem for i in held], [list(i.steps) for i in held]), strict=True)
    )
    test = score_on_test(prm, threads=threads)["test"]["all"]
    return {
        "solutions": len(examples),
        "f1": test["f1"],
        "f1_interval": [test["lo"], test["hi"]],
        "validation_f1": round(held_out_f1(prm, held, features), 4),
        "agreement": round(agree / len(examples), 3),
    }


def _streaming_arm(
    order: str,
    home: Path,
    budget_s: float,
    *,
    engine_url: str | None,
    quick: bool,
    levels: str,
    seed: int,
    say: Any,
) -> dict[str, Any]:
    from prmloop.flows.lab.bench.rounds_arm import OVERTIME_FACTOR
    from prmloop.flows.loop.driver import LOOP_SERVICES, Loop, LoopSettings

    settings = LoopSettings(
        # --quick: the arm ends at its third scored retrain, past the budget if need be, as the rounds arm.
        minutes=(OVERTIME_FACTOR if quick else 1.0) * budget_s / 60.0,
        order=order,
        levels=levels,
        seed=seed,
        engine="vllm" if engine_url else "transformers",
        retrain_every=2 if quick else 10,
        retrain_seconds=10.0 if quick else 60.0,
        min_labels=2 if quick else 6,
        until_retrains=QUICK_RETRAINS if quick else None,
        calibrate_minutes=None,
    )
    services = tuple(s for s in LOOP_SERVICES if s not in ("prefect", "deployments"))
    loop = Loop(settings, home=home, say=say, services=services, engine_url=engine_url)
    try:
        loop.start()
        loop.run()
    finally:
        loop.stop(keep=frozenset(), grace_s=5.0)
    result = loop.result()
    result.pop("rss_mib", None)
    return result


def bench_loop_real(
    *,
    minutes: float = 5.0,
    quick: bool = False,
    arms: tuple[str, ...] = ARMS,
    levels: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    root: Path | None = None,
    say: Any = print,
) -> dict[str, Any]:
    """Run the ``arms`` for ``minutes`` each on the curriculum ``levels`` (default 1,2; ``quick``: level 1,
    80 s per arm, retraining every 2 new labels, each arm ending at its third scored retrain, past the 80 s
    where it needs to, :data:`~prmloop.flows.lab.bench.rounds_arm.OVERTIME_FACTOR` times them at most)."""
    from prmloop.flows.lab.bench.rounds_arm import run_rounds_arm
    from prmloop.flows.ops.engine import engine_unavailable
    from prmloop.flows.ops.services import prefect_api_url, read_state
    from prmloop.flows.ops.stack import down, up
    from prmloop.flows.retrain_ensemble import eval_items
    from prmloop.store.tables.metrics import label_quality

    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    budget_s = 80.0 if quick else 60.0 * minutes
    levels = levels or ("1" if quick else "1,2")
    started = time.monotonic()
    root = root or StateSettings().home / "bench" / "loop" / time.strftime("%Y%m%d-%H%M%S")
    shared = StateSettings(home=root)
    for home in (root, root / "prefect", *(root / arm for arm in arms)):
        share_credentials(StateSettings().home, home)
    out: dict[str, Any] = {"budget_s": budget_s, "quick": quick, "levels": levels}
    with _environment():
        os.environ["PRMLOOP_HOME"] = str(root)
        reason = engine_unavailable()
        # The Prefect server starts in a home of its own, beside the engine's start (each home runs one
        # `up` at a time); the held-out set's sampler finds the engine in the bench's home.
        ui = StateSettings(home=root / "prefect")

        def start_ui() -> None:
            try:
                up(["prefect"], state=ui, say=say)
            except (OSError, RuntimeError) as error:  # the arms still run, each flow on a temporary server
                say(f"bench: the Prefect server did not start ({error}); flow runs use a temporary one")

        starting = threading.Thread(target=start_ui, name="prefect-start")
        starting.start()
        if reason is None:
            up(["engine"], state=shared, say=say)
        starting.join()
        record = read_state(shared, "engine")
        engine_url = record.url if record is not None and record.alive else None
        out["engine"] = "vllm" if engine_url else f"transformers ({reason})"
        out["device"] = in_process_device()
        url = prefect_api_url(ui)
        if url:
            os.environ["PREFECT_API_URL"] = url
        say("held-out set: building or reading the cache")
        heldout = eval_items("arith", limit=8, threads=threads)
        out["heldout_solutions"] = len(heldout)
        # The held-out set's backbone features, computed once here: every arm's first retrain would
        # otherwise pay for them (about 10 s on 2 cores), and the first arm alone if they were shared.
        warm_features(heldout, root / "features", threads=threads)
        try:
            for arm in arms:
                home = root / arm
                (home / "bench").mkdir(parents=True, exist_ok=True)
                # The held-out set and its features, made once for every arm.
                for link, target in (
                    (home / "bench" / "active", root / "bench" / "active"),
                    (home / "features", root / "features"),
                ):
                    if not link.exists():
                        link.symlink_to(target, target_is_directory=True)
                say(f"arm {arm}: {budget_s:.0f} s")
                with _environment():
                    if arm == "rounds":
                        result = run_rounds_arm(
                            home=home,
                            budget_s=budget_s,
                            engine_url=engine_url,
                            levels=tuple(int(v) for v in levels.split(",")),
                            rounds=3,
                            eval_set="arith",
                            seed=seed,
                            threads=threads,
                            idle_s=1.0 if quick else 3.0,
                            until_retrains=QUICK_RETRAINS if quick else None,
                            say=say,
                        )
                    else:
                        order = "priority" if arm == "streaming" else "random"
                        result = _streaming_arm(
                            order, home, budget_s, engine_url=engine_url, quick=quick, levels=levels, seed=seed, say=say
                        )
                    os.environ["PRMLOOP_HOME"] = str(home)
                    result["final_f1"] = result["f1_curve"][-1][1] if result["f1_curve"] else None
                    last = result["test_curve"][-1] if result.get("test_curve") else None
                    result["final_f1_interval"] = [last["lo"], last["hi"]] if last else None
                    result["exact_labels"] = exact_label_f1(StateSettings().db_path, "arith", 8, threads)
                    quality = label_quality(StateSettings().db_path)
                    result["acceptance_rate"] = quality["acceptance_rate"]
                    result["mc_exact_agreement"] = quality["mc_exact_agreement"]
                out[arm] = result
        finally:
            down(state=ui, say=say)
            down(state=shared, say=say)
    _ratios(out)
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def _ratios(out: dict[str, Any]) -> None:
    streaming, rounds, rand = out.get("streaming"), out.get("rounds"), out.get("random_order")
    if streaming and rounds:
        base = rounds["accepted_per_minute"]
        out["streaming_to_rounds_ratio"] = round(streaming["accepted_per_minute"] / base, 3) if base else None
    if streaming and rand:
        base = rand["accepted_per_1k_tokens"]
        out["priority_to_random_ratio"] = round(streaming["accepted_per_1k_tokens"] / base, 3) if base else None
        tokens = min(streaming["generated_tokens"], rand["generated_tokens"])
        out["f1_at_equal_tokens"] = {
            "tokens": tokens,
            "streaming": f1_at_tokens(streaming["retrains"], tokens),
            "random_order": f1_at_tokens(rand["retrains"], tokens),
        }
