"""``prmloop eval judge`` end to end on the tiny model: every file written, the counts add up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from prmloop.flows.lab.evals.judge import EvalJudgeSettings, evaluate_judge
from prmloop.models.processbench import read_processbench

if TYPE_CHECKING:
    from prmloop.models.backends.registry import BackendConfig


def test_the_evaluation_judges_up_to_the_labelled_error_and_writes_its_files(
    shared_data_dir: Path, tiny_backend_config: BackendConfig, tmp_path: Path
) -> None:
    file = shared_data_dir / "processbench" / "gsm8k.json"
    settings = EvalJudgeSettings(
        file=file,
        limit=2,
        samples=1,
        max_new_tokens=6,
        critic_max_new_tokens=6,
        backend=tiny_backend_config.backend,
        model=tiny_backend_config.model,
        out_dir=tmp_path,
    )
    summary = evaluate_judge(settings)
    items, _ = read_processbench(file)
    wrong = next(i for i in items if i.label >= 0)
    right = next(i for i in items if i.label < 0)
    assert summary["solutions"] == 2 and summary["judged_steps"] == wrong.label + 1 + len(right.steps)
    assert summary["critic"] is not None and summary["critic"]["f1"] is not None
    assert summary["tokens_per_judged_step"] > 0
    saved = json.loads(Path(summary["files"]["summary"]).read_text())
    assert saved["judged_steps"] == summary["judged_steps"]
    assert len(Path(summary["files"]["steps"]).read_text().splitlines()) == summary["judged_steps"]
    assert Path(summary["files"]["table"]).read_text().startswith("| measure |")
