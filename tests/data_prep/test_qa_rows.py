"""Question normalisation policy, row ids, and the parquet row schema round-tripping through pyarrow and pandas.

Run: python -m pytest tests/data_prep/test_qa_rows.py -q
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from data_prep.rows import (
    ROW_SCHEMA,
    check_source_name,
    make_row,
    make_row_id,
    normalise_question,
    question_key,
    read_rows,
    write_rows,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("who got the first nobel prize in physics", "who got the first nobel prize in physics?"),
        ("  Which  French ace pilot\tflew\nL'Oiseau Blanc ", "Which French ace pilot flew L'Oiseau Blanc?"),
        ("Is it raining?", "Is it raining?"),
        ("Where is it headquartered? ", "Where is it headquartered?"),
        ('recorded the album "Old and in the Way?"', 'recorded the album "Old and in the Way?"?'),
        (
            "Born on 6 March 1937, this man was a citizen of the UK.",
            "Born on 6 March 1937, this man was a citizen of the UK.?",
        ),
        ("   ", ""),
    ],
)
def test_normalise_question_policy(raw: str, expected: str) -> None:
    assert normalise_question(raw) == expected
    assert normalise_question(expected) == expected  # idempotent


def test_ids_use_native_id_or_question_hash() -> None:
    assert make_row_id("hotpotqa", "test", "q?", "5a85ea09") == "hotpotqa-test-5a85ea09"
    key = question_key("who wrote hamlet?")
    assert key.startswith("q") and len(key) == 17 and key != question_key("who wrote macbeth?")
    assert make_row_id("nq", "train", "who wrote hamlet?", None) == f"nq-train-{key}"
    # The same question from two sources or splits never shares an id.
    assert (
        len({make_row_id(s, sp, "who wrote hamlet?", None) for s in ("nq", "triviaqa") for sp in ("train", "test")})
        == 4
    )


@pytest.mark.parametrize("bad", ["", "nq-open", "my source", "nq/test"])
def test_bad_source_names_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="may use only letters"):
        check_source_name(bad)


def _rows() -> list[dict]:
    return [
        make_row(
            source="nq",
            split="test",
            index=0,
            row_id="nq-test-q1",
            question="who?",
            answers=["Ann", "Anne"],
            prompt="Question: who?\n",
        ),
        make_row(
            source="hotpotqa",
            split="test",
            index=1,
            row_id="hotpotqa-test-5a",
            question="what?",
            answers=["x"],
            prompt="Question: what?\n",
        ),
    ]


def test_parquet_round_trip_keeps_nested_fields(tmp_path: Path) -> None:
    out = tmp_path / "rows.parquet"
    write_rows(_rows(), out)
    assert pq.read_schema(out).remove_metadata() == ROW_SCHEMA
    assert read_rows(out) == _rows()

    df = pd.read_parquet(out)
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info", "question"]
    first = df.iloc[0]
    assert first["prompt"][0]["role"] == "user" and first["prompt"][0]["content"] == "Question: who?\n"
    assert list(first["reward_model"]["ground_truth"]["target"]) == ["Ann", "Anne"]
    assert first["reward_model"]["style"] == "rule" and first["ability"] == "fact-reasoning"
    assert first["extra_info"] == {"split": "test", "index": 0, "id": "nq-test-q1"}


def test_write_is_deterministic_and_atomic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_rows(_rows(), a)
    write_rows(_rows(), b)
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet"]  # no .tmp left behind


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        # pyarrow alone would silently store this string target as ["A", "n", "n"].
        ("reward_model", {"style": "rule", "ground_truth": {"target": "Ann"}}, "target must be a non-empty list"),
        ("reward_model", {"style": "rule", "ground_truth": {"target": []}}, "target must be a non-empty list"),
        ("prompt", "Question: who?", "prompt must be a non-empty list"),
        ("extra_info", {"split": "test", "index": "0", "id": "x"}, "extra_info must be"),
        ("question", "", "question must be a non-empty string"),
    ],
)
def test_write_rejects_malformed_rows(tmp_path: Path, column: str, value: object, expected: str) -> None:
    rows = _rows()
    rows[1][column] = value
    with pytest.raises(ValueError, match=f"row 1 .*{expected}"):
        write_rows(rows, tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()
