"""PRM data, one-pass scoring, LoRA training, the head's save/load and resuming, on a tiny real model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prmloop.models.prm.data import STEP_TAG, PRMExample, encode_solution, label_token_ids
from prmloop.models.prm.model import PRM, PRMConfig
from prmloop.models.prm.train import train_prm

PROBLEM = "Tom has 3 bags of 4 apples. How many apples?"
GOOD = ("3 * 4 = 12 apples.", "The answer is 12.")
BAD = ("3 * 4 = 15 apples, wrong.", "The answer is 15, wrong.")


def _examples(n: int = 8) -> list[PRMExample]:
    out = []
    for i in range(n):
        if i % 2:
            out.append(PRMExample(PROBLEM, GOOD, (True, True), (0.9, 0.8)))
        else:
            out.append(PRMExample(PROBLEM, BAD, (False, False), (0.1, 0.0)))
    return out


def _prm(tiny_lm: Callable[..., Any], tokenizer: Any, **config: Any) -> PRM:
    cfg = PRMConfig(lora_dropout=0.0, **config)
    return PRM.create(cfg, model=tiny_lm(), tokenizer=tokenizer)


def test_tags_are_where_the_encoding_says(smollm2_tokenizer: Any) -> None:
    encoded = encode_solution(smollm2_tokenizer, PROBLEM, (*GOOD, "x"), max_length=1024)
    tag = smollm2_tokenizer.encode(STEP_TAG, add_special_tokens=False)[-1]
    assert len(encoded.tag_positions) == 3 and encoded.tag_positions == sorted(encoded.tag_positions)
    assert all(encoded.input_ids[p] == tag for p in encoded.tag_positions)
    assert encoded.tag_positions[-1] == len(encoded.input_ids) - 1
    short = encode_solution(smollm2_tokenizer, PROBLEM, GOOD, max_length=encoded.tag_positions[0] + 2)
    assert len(short.tag_positions) == 1  # the second step did not fit and was dropped
    plus, minus = label_token_ids(smollm2_tokenizer)
    assert plus != minus


def test_examples_check_their_lengths() -> None:
    with pytest.raises(ValueError, match="2 steps but 1 labels"):
        PRMExample("p", ("a", "b"), (True,))
    assert PRMExample("p", ("a",), (False,), (0.25,)).targets(soft=True) == (0.25,)
    assert PRMExample("p", ("a",), (False,), (0.25,)).targets(soft=False) == (0.0,)


@pytest.mark.parametrize("formulation", ["step_tag", "head"])
def test_one_pass_equals_one_pass_per_prefix(
    formulation: str, tiny_lm: Callable[..., Any], smollm2_tokenizer: Any
) -> None:
    prm = _prm(tiny_lm, smollm2_tokenizer, formulation=formulation)
    steps = [*GOOD, "So 12 it is.", "Done."]
    [one_pass] = prm.score_solutions([PROBLEM], [steps])
    assert len(one_pass) == 4 and all(0.0 < s < 1.0 for s in one_pass)
    assert one_pass == pytest.approx(prm.score_prefixes(PROBLEM, steps), abs=1e-5)
    # batched with a longer solution (right padding) gives the same numbers
    batched = prm.score_solutions([PROBLEM, PROBLEM], [steps, [*steps, "More.", "And more."]])
    assert batched[0] == pytest.approx(one_pass, abs=1e-5)


@pytest.mark.parametrize(("formulation", "labels"), [("step_tag", "hard"), ("head", "soft")])
def test_training_learns_a_separable_toy_task(
    formulation: str, labels: str, tiny_lm: Callable[..., Any], smollm2_tokenizer: Any, tmp_path: Path
) -> None:
    config = PRMConfig(
        formulation=formulation, labels=labels, lora_dropout=0.0, learning_rate=5e-3, epochs=8, batch_size=4, lora_r=4
    )
    prm = PRM.create(config, model=tiny_lm(), tokenizer=smollm2_tokenizer)
    steps_seen: list[float] = []
    result = train_prm(_examples(), config, tmp_path, prm=prm, on_step=lambda m: steps_seen.append(m["loss"]))
    assert result.steps == len(steps_seen) == 16
    assert steps_seen[-1] < steps_seen[0]
    good, bad = prm.score_solutions([PROBLEM, PROBLEM], [GOOD, BAD])
    assert min(good) > max(bad)
    assert (tmp_path / "loss.csv").read_text().count("\n") == 17
    assert (result.artifact_dir / "adapter" / "adapter_config.json").is_file()


def test_a_saved_head_comes_back_and_a_fresh_one_would_not_match(
    tiny_lm: Callable[..., Any], smollm2_tokenizer: Any, tmp_path: Path
) -> None:
    config = PRMConfig(formulation="head", lora_dropout=0.0, learning_rate=5e-3, epochs=2, batch_size=4)
    prm = PRM.create(config, model=tiny_lm(), tokenizer=smollm2_tokenizer)
    train_prm(_examples(), config, tmp_path, prm=prm)
    [before] = prm.score_solutions([PROBLEM], [GOOD])
    assert (tmp_path / "prm" / "head.pt").is_file()
    again = PRM.load(tmp_path / "prm", model=tiny_lm(), tokenizer=smollm2_tokenizer)
    assert again.score_solutions([PROBLEM], [GOOD])[0] == pytest.approx(before, abs=1e-6)
    fresh = PRM.create(config.model_copy(update={"seed": 1}), model=tiny_lm(), tokenizer=smollm2_tokenizer)
    assert fresh.score_solutions([PROBLEM], [GOOD])[0] != pytest.approx(before, abs=1e-6)


def test_an_interrupted_run_resumes_to_the_same_weights(
    tiny_lm: Callable[..., Any], smollm2_tokenizer: Any, tmp_path: Path
) -> None:
    config = PRMConfig(lora_dropout=0.0, learning_rate=5e-3, epochs=2, batch_size=2, checkpoint_every=100)
    straight = PRM.create(config, model=tiny_lm(), tokenizer=smollm2_tokenizer)
    train_prm(_examples(), config, tmp_path / "a", prm=straight)
    first = PRM.create(config, model=tiny_lm(), tokenizer=smollm2_tokenizer)
    partial = train_prm(_examples(), config, tmp_path / "b", prm=first, stop_after=3)
    assert partial.steps == 3 and not (tmp_path / "b" / "prm").exists()
    second = PRM.create(config, model=tiny_lm(), tokenizer=smollm2_tokenizer)  # a new process, as it were
    resumed = train_prm(_examples(), config, tmp_path / "b", prm=second)
    assert resumed.steps == 8
    assert second.score_solutions([PROBLEM], [GOOD])[0] == pytest.approx(
        straight.score_solutions([PROBLEM], [GOOD])[0], abs=1e-6
    )
