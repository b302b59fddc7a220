"""The ProcessBench protocol for a scalar PRM (hand-made predictions) and the separator-token scorer."""

from __future__ import annotations

from typing import Any

import pytest

from prmloop.models.prm.evaluate import best_threshold, first_below, processbench_scores
from prmloop.models.prm.qwen import QWEN_SEPARATOR, SeparatorPRM


def test_first_step_below_the_threshold() -> None:
    assert first_below([0.9, 0.4, 0.2], 0.5) == 1
    assert first_below([0.9, 0.8], 0.5) == -1
    assert first_below([], 0.5) == -1


def test_processbench_scores_by_hand() -> None:
    scores = [[0.9, 0.3], [0.8, 0.9, 0.2], [0.9, 0.9], [0.2, 0.9]]
    labels = [1, 1, -1, -1]
    # at 0.5: predictions 1, 2, -1, 0 -> erroneous 1/2 right, correct 1/2 right -> F1 0.5
    result = processbench_scores(scores, labels, 0.5)
    assert (result["error_accuracy"], result["correct_accuracy"], result["f1"]) == (0.5, 0.5, 0.5)
    # at 0.25: predictions -1, 2, -1, 0 -> erroneous 0/2, correct 1/2 -> F1 0
    assert processbench_scores(scores, labels, 0.25)["f1"] == 0.0


def test_the_best_threshold_is_chosen_by_f1() -> None:
    scores = [[0.9, 0.3], [0.8, 0.35], [0.9, 0.9], [0.7, 0.9]]
    labels = [1, 1, -1, -1]
    t = best_threshold(scores, labels)
    assert 0.35 < t <= 0.7 and processbench_scores(scores, labels, t)["f1"] == 1.0


def test_separator_scorer_reads_class_one_at_each_separator(smollm2_tokenizer: Any) -> None:
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForTokenClassification

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [QWEN_SEPARATOR]})
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForTokenClassification(config).eval()  # logits (batch, tokens, 2), like Qwen2.5-Math-PRM
    scorer = SeparatorPRM(model, tokenizer)
    steps = ["3 * 4 = 12.", "The answer is 12."]
    [scores] = scorer.score_solutions(["What is 3*4?"], [steps])
    assert len(scores) == 2 and all(0.0 < s < 1.0 for s in scores)
    ids = tokenizer(scorer.text("What is 3*4?", steps), return_tensors="pt").input_ids
    with torch.inference_mode():
        probs = torch.softmax(model(input_ids=ids).logits, dim=-1)[0, :, 1]
    where = (ids[0] == tokenizer.convert_tokens_to_ids(QWEN_SEPARATOR)).nonzero().flatten().tolist()
    assert len(where) == 2 and scores == pytest.approx(probs[where].tolist())
