"""Files through the ``prmloop`` entry point: export never overwrites silently, dataset import keeps
the good lines of a damaged file and names the bad ones (issue 25, point 5)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.cli import main
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore


def run_main(capfd: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``prmloop <args>`` through the console entry point (:func:`main`), in this process."""
    code = 0
    argv = sys.argv
    sys.argv = ["prmloop", *args]
    try:
        main()
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    finally:
        sys.argv = argv
    out, err = capfd.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    return tmp_path / "home"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(60, k=2)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 60)])
    return store.path


# --------------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------------


def test_export_to_a_file_instead_of_a_folder_is_one_line(db: Path, tmp_path: Path, home: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("mine")
    env = {**os.environ, "PRMLOOP_HOME": str(home)}
    result = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "export", "steps", "--db", str(db), "--out", str(taken)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --out {taken} is a file, not a folder; give a folder for the <view>.parquet files"
    ]
    assert taken.read_text() == "mine"


def test_export_refuses_to_overwrite_without_force_and_says_what_force_replaced(
    db: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    precious = out / "steps.parquet"
    old = b"someone else's file"
    precious.write_bytes(old)
    code, stdout, err = run_main(capfd, "export", "events", "steps", "--db", str(db), "--out", str(out))
    assert code == 2 and stdout == "" and "Traceback" not in err
    assert f"{precious} already exists; nothing written: pass --force" in err and len(err.strip().splitlines()) == 1
    assert precious.read_bytes() == old
    assert [p.name for p in out.iterdir()] == ["steps.parquet"]  # not even events: refused before any write

    code, stdout, err = run_main(capfd, "export", "events", "steps", "--db", str(db), "--out", str(out), "--force")
    assert code == 0, err
    rows = {r["view"]: r for r in map(json.loads, stdout.splitlines())}
    assert rows["steps"]["replaced_bytes"] == len(old) and rows["events"]["replaced_bytes"] is None
    assert f"export: replaced {precious} ({len(old)} bytes before)" in err
    assert pq.read_table(precious).num_rows == rows["steps"]["rows"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["events.parquet", "steps.parquet"]  # no partial left


# --------------------------------------------------------------------------------------------------
# dataset import
# --------------------------------------------------------------------------------------------------


def _case(idx: int) -> dict[str, object]:
    return {
        "idx": str(idx),
        "question": f"What is {idx}+1?",
        "modified_question": f"What is {idx}+1?",
        "modified_process": [f"{idx}+1={idx + 2}", "So it is done."],
        "error_steps": [1],
        "original_process": [f"{idx}+1={idx + 1}"],
        "classification": "circular",
    }


def _line(idx: int) -> bytes:
    return json.dumps(_case(idx)).encode()


def _manifest(stdout: str) -> dict[str, object]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _rows(manifest: dict[str, object]) -> int:
    counts = manifest["rows"]
    assert isinstance(counts, dict)
    return sum(counts.values())


def test_bad_prmbench_lines_are_named_and_skipped_and_good_ones_kept(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.jsonl"
    lines = [
        _line(1),
        b'{"idx": "9", "question": "caf\xe9"}',  # not UTF-8
        b"[" * 100_000 + b"]" * 100_000,  # far deeper than any parser's recursion limit
        json.dumps({**_case(7), "modified_process": [["not", "a", "step"]]}).encode(),
        _line(2),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    code, stdout, err = run_main(capfd, "dataset", "import", "prmbench", str(path), "--root", str(tmp_path / "s"))
    assert code == 0, err
    assert "Traceback" not in err
    assert f"{path}:2: not UTF-8" in err
    assert f"{path}:3: JSON nested too deeply" in err
    assert f"{path}:4: not a PRMBench case (modified_process.0: Input should be a valid string)" in err
    assert f"{path}: 4 solutions read, 3 problems" in err
    assert _rows(_manifest(stdout)) == 4  # lines 1 and 5: the modified and the original solution of each


def test_a_deep_math_shepherd_line_is_skipped_and_the_others_kept(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    good = {"input": "What is 2+3? Step 1: 2+3=5 ки\nStep 2: The answer is 6 ки", "label": ""}
    good["label"] = good["input"].replace("5 ки", "5 +").replace("6 ки", "6 -")
    path = tmp_path / "shepherd.jsonl"
    deep = b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b', "label": "x"}'
    path.write_bytes(json.dumps(good).encode() + b"\n" + deep + b"\n" + json.dumps(good).encode() + b"\n")
    code, stdout, err = run_main(capfd, "dataset", "import", "shepherd", str(path), "--root", str(tmp_path / "s"))
    assert code == 0, err
    assert f"{path}:2: JSON nested too deeply" in err and "Traceback" not in err
    assert _rows(_manifest(stdout)) == 2


def test_a_truncated_archive_keeps_what_was_read_and_says_where_it_ended(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = b"".join(_line(i) + b"\n" for i in range(300))
    packed = gzip.compress(data)
    path = tmp_path / "bench.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    readable = zlib.decompressobj(wbits=31).decompress(packed[: len(packed) // 2])
    whole_lines = readable.count(b"\n")
    assert 0 < whole_lines < 300
    code, stdout, err = run_main(capfd, "dataset", "import", "prmbench", str(path), "--root", str(tmp_path / "s"))
    assert code == 0, err
    assert f"{path}:{whole_lines + 1}: the file ends early (truncated?); reading stopped here" in err
    assert _rows(_manifest(stdout)) == 2 * whole_lines


def test_a_gz_file_that_is_not_compressed_is_read_as_text_with_a_note(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.jsonl.gz"
    path.write_bytes(_line(1) + b"\n" + _line(2) + b"\n")
    code, stdout, err = run_main(capfd, "dataset", "import", "prmbench", str(path), "--root", str(tmp_path / "s"))
    assert code == 0, err
    assert f"{path}: named .gz but not gzip-compressed; read as plain text" in err and "Traceback" not in err
    assert _rows(_manifest(stdout)) == 4


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'[{"id": "a", "problem": "x"', "not JSON (Expecting ',' delimiter at line 1 column 28)"),
        (b'{"id": "a"}\n{"id": "b"}\n', "(it looks like JSON lines)"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply to read"),
    ],
)
def test_a_processbench_file_that_is_not_one_json_array_is_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], content: bytes, expected: str
) -> None:
    path = tmp_path / "gsm8k.json"
    path.write_bytes(content)
    code, stdout, err = run_main(capfd, "dataset", "import", "processbench", str(path), "--root", str(tmp_path / "s"))
    assert code == 2 and stdout == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: {path}: ") and expected in line
    assert "one non-empty JSON list of ProcessBench solutions" in line
