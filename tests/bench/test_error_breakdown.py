"""bench/error_breakdown.py counts yes/no questions, their answers, second searches and where read-wrong answers came
from, from evaluation records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("error_breakdown")


def _record(
    source: str, gold: list[str], answer: str | None, em: float, searches: int, sample: int = 0, **more: object
) -> dict:
    calls = [{"query": f"q{i}", "passage_ids": [], "failed": False} for i in range(searches)]
    return more | {
        "data_source": source,
        "gold": gold,
        "answer": answer,
        "reward_components": {"em": em},
        "search_calls": calls,
        "sample": sample,
    }


def test_counts_from_first_samples(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "\n\n<information>Doc 1(Title: France) Paris and Lyon are French.\nDoc 2(Title: Nice) Nice.</information>"
    shown = {"kind": "observation", "text": text}
    records = [
        _record("hotpotqa", ["yes"], "Yes.", 1.0, 1),  # yes/no, answered with a judgement, right
        _record("hotpotqa", ["no"], "both", 0.0, 2),  # yes/no, answered with an entity; searched twice
        _record("hotpotqa", ["no", "Paris"], "no", 1.0, 1),  # not a yes/no question: one gold is not
        _record("nq", ["Paris"], None, 0.0, 0),
        _record("hotpotqa", ["no"], "no", 1.0, 3, sample=1),  # a second sample: not counted
        # read wrong, from a record written before answer_source: recomputed from the observation's passages
        _record("nq", ["Paris"], "Lyon", 0.0, 1, outcome="read_wrong", segments=[shown]),
        _record("nq", ["Paris"], "Nice", 0.0, 1, outcome="read_wrong", segments=[shown]),
        _record("nq", ["Paris"], "x", 0.0, 1, outcome="read_wrong", answer_source="other_passage", segments=[]),
    ]
    got = bench.breakdown(records)
    assert got == {
        "n": 7,
        "em": pytest.approx(2 / 7),
        "em_hotpotqa": pytest.approx(2 / 3),
        "em_nq": 0.0,
        "two_searches": 1,
        "yes_no": 2,
        "yes_no_answered": 1,
        "yes_no_right": 1.0,
        "read_wrong": 3,
        "read_wrong_gold_passage": 1,  # "Lyon" is in Doc 1, beside Paris
        "read_wrong_other_passage": 2,  # "Nice" only in Doc 2 (its title and text); the record's own source
        "read_wrong_not_shown": 0,
    }
    run = tmp_path / "eval" / "search-20261125-000000"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text("{}")
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert bench.main([f"a={tmp_path / 'eval'}"]) == 0
    out = capsys.readouterr().out
    assert "| a | 7 | 0.286 | 0.667 | 0.000 | 1 | 2 | 1 | 1 | 3 | 1 | 2 | 0 |" in out
    assert out.rstrip().endswith("error_breakdown a:em=0.286,yes_no_right=1/2")
    assert bench.main([f"b={tmp_path / 'nowhere'}"]) == 2
    assert "no main_eval output" in capsys.readouterr().err
