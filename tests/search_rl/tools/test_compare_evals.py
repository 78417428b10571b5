"""compare_evals: the table and the paired EM comparison of evaluations on the same questions.

Run: python -m pytest tests/search_rl/tools/test_compare_evals.py -q
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from search_rl.tools.compare_evals import load_eval, main, mcnemar_p, paired, report, run_folder

FINGERPRINT = {"retriever": {"backend": "http", "index_key": "k1", "topk": 3}, "budgets": {"max_turns": 4}}
"""The same fingerprint for every row unless a test says otherwise (the model section may differ)."""


def write_eval(
    folder: Path, em: dict[str, float], when: str = "20261123-070000", fingerprint: dict | None = FINGERPRINT
) -> Path:
    """A ``main_eval`` output folder: metrics.json and one trajectory line per question (the keys it writes)."""
    run = folder / f"search-{when}"
    run.mkdir(parents=True)
    mean = sum(em.values()) / len(em)
    metrics = {"model": str(folder), "eval/all/em": mean, "eval/all/f1": mean, "eval/all/n": float(len(em))}
    if fingerprint is not None:
        metrics["fingerprint"] = {**fingerprint, "model": {"path": str(folder)}}
    (run / "metrics.json").write_text(json.dumps(metrics))
    lines = [json.dumps({"uid": uid, "reward_components": {"em": v, "f1": v}}) for uid, v in em.items()]
    (run / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_mcnemar_matches_the_binomial_tail():
    assert mcnemar_p(6, 1) == pytest.approx(2 * (1 + 7) / 2**7)  # 0.125
    assert mcnemar_p(21, 12) == pytest.approx(2 * sum(math.comb(33, i) for i in range(13)) / 2**33)
    assert mcnemar_p(3, 3) == 1.0  # capped: a tied split is no evidence either way
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(10, 0) == pytest.approx(2 / 2**10)


def test_paired_counts_and_table(tmp_path):
    sft = load_eval("sft", write_eval(tmp_path / "sft", {"a": 0, "b": 1, "c": 0, "d": 1}))
    rl = load_eval("rl", write_eval(tmp_path / "rl", {"a": 1, "b": 1, "c": 1, "d": 0}))
    p = paired(sft, rl)
    assert (p.better, p.worse) == (2, 1)
    assert p.p == pytest.approx(1.0)
    text = report([sft, rl])
    assert "| sft | 0.500 | 0.500 | – | – | – |" in text
    assert "| rl | 0.750 |" in text
    assert "4 questions" in text
    assert "rl vs sft: better on 2, worse on 1 questions" in text


def test_newest_run_is_read(tmp_path):
    write_eval(tmp_path / "m", {"a": 0}, when="20261123-070000")
    newest = write_eval(tmp_path / "m", {"a": 1}, when="20261123-080000")
    assert run_folder(tmp_path / "m") == newest
    assert load_eval("m", tmp_path / "m").em == {"a": 1.0}


def test_different_questions_are_an_error(tmp_path):
    a = load_eval("a", write_eval(tmp_path / "a", {"q1": 1, "q2": 0}))
    b = load_eval("b", write_eval(tmp_path / "b", {"q1": 1, "q3": 0}))
    with pytest.raises(ValueError, match="different questions .1 only in the first, 1 only in the second"):
        paired(a, b)


def test_bad_trajectory_line_names_file_and_line(tmp_path):
    run = write_eval(tmp_path / "x", {"q1": 1})
    with (run / "trajectories.jsonl").open("a") as f:
        f.write(json.dumps({"uid": "q2"}) + "\n")
    with pytest.raises(ValueError, match=r"trajectories.jsonl:2: trajectory without uid or reward_components.em"):
        load_eval("x", tmp_path / "x")


def test_sampled_evaluation_is_refused(tmp_path):
    run = write_eval(tmp_path / "s", {"q1": 1, "q2": 0})
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "n_samples": 4}))
    with pytest.raises(ValueError, match=r"a sampled evaluation \(n_samples=4\).*n_samples=1"):
        load_eval("s", tmp_path / "s")
    (run / "metrics.json").write_text(json.dumps({**metrics, "n_samples": 1}))
    assert load_eval("s", tmp_path / "s").em == {"q1": 1.0, "q2": 0.0}


def test_cli(tmp_path, capsys):
    write_eval(tmp_path / "sft", {"a": 0, "b": 0})
    write_eval(tmp_path / "rl", {"a": 1, "b": 0})
    assert main([f"sft={tmp_path / 'sft'}", f"rl={tmp_path / 'rl'}"]) == 0
    assert "rl vs sft: better on 1, worse on 0" in capsys.readouterr().out
    assert main([f"x={tmp_path / 'missing'}"]) == 2
    assert "no main_eval output" in capsys.readouterr().err
    assert main(["no-equals-sign"]) == 2
    assert "expected NAME=DIR" in capsys.readouterr().err


def test_a_row_without_fingerprint_is_refused_unless_allowed(tmp_path, capsys):
    write_eval(tmp_path / "old", {"a": 0, "b": 0}, fingerprint=None)
    write_eval(tmp_path / "new", {"a": 1, "b": 0})
    assert main([f"old={tmp_path / 'old'}", f"new={tmp_path / 'new'}"]) == 2
    err = capsys.readouterr().err
    assert "old: no fingerprint (to compare it unchecked: --allow fingerprint)" in err
    assert main([f"old={tmp_path / 'old'}", f"new={tmp_path / 'new'}", "--allow", "fingerprint"]) == 0
    assert "old: no fingerprint: not checked (--allow fingerprint)" in capsys.readouterr().out


def test_an_unpinned_retriever_is_refused_even_when_both_rows_say_the_same(tmp_path, capsys):
    unpinned = {**FINGERPRINT, "retriever": {"backend": "http", "unpinned": "retriever gave no description", "topk": 3}}
    write_eval(tmp_path / "a", {"a": 0, "b": 0}, fingerprint=unpinned)
    write_eval(tmp_path / "b", {"a": 1, "b": 0}, fingerprint=unpinned)
    rows = [f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"]
    assert main(rows) == 2
    err = capsys.readouterr().err
    assert "a: retriever not pinned (retriever gave no description) (to compare it unchecked: --allow " in err
    assert "b: retriever not pinned" in err and "--allow retriever.unpinned" in err
    assert main([*rows, "--allow", "retriever.unpinned"]) == 0
    assert "a: retriever not pinned (retriever gave no description): not checked" in capsys.readouterr().out
