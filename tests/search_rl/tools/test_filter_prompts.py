"""``search_rl.tools.filter_prompts``: the training questions a sampled policy solves sometimes but not always.

Evaluation folders are written as ``main_eval`` writes them (``metrics.json`` + ``trajectories.jsonl``, the fields the
tool reads); the questions are the first rows of the shipped training parquet.

Run: python -m pytest tests/search_rl/tools/test_filter_prompts.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from search_rl.sft.rows import read_input
from search_rl.tools.filter_prompts import main

TRAIN = Path(__file__).resolve().parents[3] / "data" / "datasets" / "nq_hotpotqa_mini" / "train.parquet"


@pytest.fixture
def questions(tmp_path):
    """(parquet of the first 6 training questions, their ids in file order)."""
    schema, rows = read_input(TRAIN, max_rows=6)
    path = tmp_path / "questions.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path, [r["extra_info"]["id"] for r in rows]


def write_run(folder: Path, ems: dict[str, list[float]]) -> Path:
    """A main_eval folder whose question ``uid`` has one record per entry of ``ems[uid]`` (samples in order)."""
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text("{}")
    lines = [
        {"uid": uid, "sample": k, "reward_components": {"em": em, "f1": em}}
        for uid, values in ems.items()
        for k, em in enumerate(values)
    ]
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def run(tmp_path: Path, questions: Path, *folders: Path, extra: tuple[str, ...] = ()) -> tuple[int, Path]:
    out = tmp_path / "kept.parquet"
    argv = [a for f in folders for a in ("--records", str(f))] + ["--questions", str(questions), "--output", str(out)]
    return main([*argv, *extra]), out


def test_keeps_questions_solved_sometimes_and_counts_every_question(questions, tmp_path, capsys):
    path, ids = questions
    # ids[5] is never sampled; ids[0] never right, ids[4] always right; ids[1..3] solved 1, 2 and 3 times of 4
    folder = write_run(
        tmp_path / "eval",
        {
            ids[3]: [1, 1, 0, 1],
            ids[0]: [0, 0, 0, 0],
            ids[1]: [0, 1, 0, 0],
            ids[4]: [1, 1, 1, 1],
            ids[2]: [1, 0, 0, 1],
        },
    )
    code, out = run(tmp_path, path, folder)
    assert code == 0
    kept = pq.read_table(out)
    assert [r["id"] for r in kept.column("extra_info").to_pylist()] == [ids[1], ids[2], ids[3]]  # the file's order
    assert kept.schema.equals(pq.read_table(path).schema, check_metadata=False)
    manifest = json.loads((tmp_path / "kept.manifest.json").read_text())
    assert manifest["questions_by_reason"] == {"kept": 3, "too_few_right": 1, "too_few_wrong": 1, "not_sampled": 1}
    assert manifest["questions_by_right_samples"] == {"0/4": 1, "1/4": 1, "2/4": 1, "3/4": 1, "4/4": 1}
    assert manifest["records_read"] == 20
    assert "'kept': 3" in capsys.readouterr().out


def test_bounds_and_pooled_runs(questions, tmp_path):
    path, ids = questions
    first = write_run(tmp_path / "a", {ids[0]: [1, 0], ids[1]: [1, 1], ids[2]: [0, 0]})
    second = write_run(tmp_path / "b", {ids[0]: [0, 0], ids[1]: [1, 0], ids[2]: [1, 1]})
    # pooled: ids[0] 1/4, ids[1] 3/4, ids[2] 2/4
    code, out = run(tmp_path, path, first, second, extra=("--min-right", "2"))
    assert code == 0
    assert [r["id"] for r in pq.read_table(out).column("extra_info").to_pylist()] == [ids[1], ids[2]]
    code, out = run(tmp_path, path, first, second, extra=("--min-wrong", "2"))
    assert code == 0
    assert [r["id"] for r in pq.read_table(out).column("extra_info").to_pylist()] == [ids[0], ids[2]]
    manifest = json.loads((tmp_path / "kept.manifest.json").read_text())
    assert manifest["questions_by_reason"]["too_few_wrong"] == 1
    assert manifest["questions_by_right_samples"] == {"1/4": 1, "2/4": 1, "3/4": 1}


def test_refuses_bad_input_and_writes_nothing(questions, tmp_path, capsys):
    path, ids = questions
    folder = write_run(tmp_path / "eval", {ids[0]: [0, 1]})
    assert run(tmp_path, path, folder, extra=("--min-rows", "2"))[0] == 1
    assert "fewer than --min-rows 2" in capsys.readouterr().err
    assert not (tmp_path / "kept.parquet").exists()

    other = write_run(tmp_path / "other", {"not-a-training-id": [0, 1]})
    assert run(tmp_path, path, other)[0] == 1
    assert "not rows of --questions" in capsys.readouterr().err

    broken = write_run(tmp_path / "broken", {ids[0]: [0, 1]})
    (broken / "trajectories.jsonl").write_text(json.dumps({"uid": ids[0], "sample": 0}) + "\n")
    assert run(tmp_path, path, broken)[0] == 1
    assert "record 0: needs uid and reward_components.em" in capsys.readouterr().err

    twice = write_run(tmp_path / "twice", {ids[0]: [0]})
    (twice / "trajectories.jsonl").write_text(2 * (json.dumps({"uid": ids[0], "reward_components": {"em": 0}}) + "\n"))
    assert run(tmp_path, path, twice)[0] == 1
    assert "recorded twice" in capsys.readouterr().err
    assert not (tmp_path / "kept.parquet").exists()

    with pytest.raises(SystemExit):
        run(tmp_path, path, folder, folder)
    assert "given twice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(tmp_path, path, folder, extra=("--min-right", "0"))
