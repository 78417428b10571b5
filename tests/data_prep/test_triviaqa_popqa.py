"""The TriviaQA and PopQA readers: both layouts of each are detected and read (value first, then aliases; a JSON-
encoded answer list decoded), bad records are reported with their place, and ``qa_to_parquet`` turns them into the
suite's rows.

Run: python -m pytest tests/data_prep/test_triviaqa_popqa.py -q
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.formats import NO_ANSWER, InvalidRecord, QARecord, detect_file_format, read_records
from data_prep.qa_to_parquet import main
from search_rl.prompt_data import read_rows

FORMATS = Path(__file__).parent / "fixtures" / "formats"


def test_official_triviaqa_json():
    path = FORMATS / "triviaqa_dev.json"
    assert detect_file_format(path) == "triviaqa"
    first, second, bad = list(read_records(path))
    assert isinstance(first, QARecord) and first.answers == ("Danube", "River Danube", "Donau")
    assert first.native_id == "tq_test_1"
    assert isinstance(second, QARecord) and second.answers == ("Au", "AU")
    assert isinstance(bad, InvalidRecord) and bad.reason == NO_ANSWER and str(bad.where).endswith("(record 3)")


def test_hf_triviaqa_parquet(tmp_path):
    path = tmp_path / "trivia_qa.parquet"
    rows = [{"question": "Capital of Peru?", "question_id": "q1", "answer": {"value": "Lima", "aliases": ["Lima"]}}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert detect_file_format(path) == "triviaqa"
    (record,) = read_records(path)
    assert isinstance(record, QARecord) and record.answers == ("Lima",) and record.native_id == "q1"


def test_popqa_rows():
    path = FORMATS / "popqa.jsonl"
    assert detect_file_format(path) == "popqa"
    first, second, bad = list(read_records(path))
    assert isinstance(first, QARecord) and first.answers == ("Austria", "Republic of Austria")
    assert first.native_id == "101"
    assert isinstance(second, QARecord) and second.answers[0] == "Frank Herbert"
    assert isinstance(bad, InvalidRecord) and bad.reason == NO_ANSWER and str(bad.where).endswith(":3")


def test_converted_rows_feed_the_suite(tmp_path):
    out = tmp_path / "popqa_test.parquet"
    rc = main(["--input", f"popqa={FORMATS / 'popqa.jsonl'}", "--split", "test", "--out", str(out), "--skip-invalid"])
    assert rc == 0
    rows = read_rows([str(out)])
    assert [r.data_source for r in rows] == ["popqa", "popqa"]
    assert rows[0].targets[:1] == ("Austria",)
