"""Every QA format reads its real fixture (copied from the raw snapshot), detection picks the right reader, and bad
records come back as InvalidRecord naming file and line.

Run: python -m pytest tests/data_prep/test_qa_formats.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.formats import (
    NO_ANSWER,
    NO_QUESTION,
    UNREADABLE,
    FormatError,
    InvalidRecord,
    QARecord,
    detect_file_format,
    read_records,
)

RAW = Path(__file__).parent / "fixtures" / "raw"

# (file under fixtures/raw, detected format, records, first question, first answers, first native id, first location)
CASES = [
    (
        "google-research-datasets__natural-questions/NQ-open.dev.jsonl",
        "nq_open",
        3,
        "when was the last time anyone was on the moon",
        ("14 December 1972 UTC", "December 1972"),
        None,
        ":1",
    ),
    (
        "google-research-datasets__natural-questions/NQ-open.efficientqa.dev.1.1.jsonl",
        "nq_open",
        3,
        "the last time la dodgers won the world series",
        ("1988",),
        None,
        ":1",
    ),
    (
        "google-research-datasets__natural-questions/NQ-open.efficientqa.test.1.1.jsonl",
        "nq_open",
        3,
        "on the 6th day of christmas my true love sent to me",
        ("6 geese a-laying", "maids a-milking"),
        None,
        ":1",
    ),
    (
        "nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz",
        "dpr",
        6,
        "who got the first nobel prize in physics",
        ("Wilhelm Conrad Röntgen",),
        None,
        ":1",
    ),
    (
        "RUC-NLPIR__FlashRAG/test.jsonl",
        "flashrag",
        3,
        "who got the first nobel prize in physics",
        ("Wilhelm Conrad Röntgen",),
        "test_0",
        ":1",
    ),
    (
        "tehranixyz__Search-R1/test.parquet",
        "searchr1_parquet",
        3,
        "who got the first nobel prize in physics?",
        ("Wilhelm Conrad Röntgen",),
        "test_0",
        " (record 1)",
    ),
    (
        "ysymyth__ReAct/hotpot_dev_v1_simplified.json",
        "hotpotqa",
        3,
        "Were Scott Derrickson and Ed Wood of the same nationality?",
        ("yes",),
        None,
        " (record 1)",
    ),
    (
        "OSU-NLP-Group__HippoRAG/hotpotqa_train.json",
        "hotpotqa",
        2,
        "If Gallu is a demon Lilu is what?",
        ("a spirit",),
        "5a77ec115542992a6e59dff7",
        " (record 1)",
    ),
    (
        "xindili-cmu__anlp-project-multihop/dev_subsampled.jsonl.gz",
        "ircot",
        4,
        "What science fantasy young adult series, told in first person, has a set of companion books narrating the "
        "stories of enslaved worlds and alien species?",
        ("Animorphs",),
        "5a85ea095542994775f606a8",
        ":1",
    ),
    (
        "OSU-NLP-Group__HippoRAG/musique_train.json",
        "musique",
        2,
        "Who was the first president of the association which published Journal of Psychotherapy Integration?",
        ("G. Stanley Hall", "Stanley Hall"),
        "2hop__150763_14904",
        " (record 1)",
    ),
    (
        "RUCAIBox__R1-Searcher/stage_1.jsonl",
        "r1searcher",
        3,
        "Which Route 22 runs through a major city?",
        ("U.S. Route 22",),
        None,
        ":1",
    ),
    (
        "RUCAIBox__R1-Searcher/stage_2.jsonl",
        "r1searcher",
        3,
        "Jonathan Glazer and Robert Rodriguez both work as what?",
        ("filmmaker",),
        None,
        ":1",
    ),
    (
        "RUCAIBox__R1-Searcher/hotpotqa_500.jsonl",
        "r1searcher",
        3,
        "In the 1973 NFL season, the Pro Bowl took place at what football stadium that is part of the Truman Sports "
        "Complex, along with what other stadium?",
        ("Kauffman Stadium",),
        None,
        ":1",
    ),
    (
        "RUCAIBox__R1-Searcher/2wiki_500.jsonl",
        "r1searcher",
        3,
        "Who is Ahmose-Henutemipet's paternal grandmother?",
        ("Tetisheri",),
        None,
        ":1",
    ),
    (
        "RUCAIBox__R1-Searcher/musique_500.jsonl",
        "r1searcher",
        3,
        "What was the director of Addicted to Love nominated for?",
        ("Academy Award for Best Live Action Short Film",),
        None,
        ":1",
    ),
    (
        "RUCAIBox__R1-Searcher/bamboogle.jsonl",
        "r1searcher",
        3,
        "Who was president of the United States in the year that Citibank was founded?",
        ("james madison",),
        None,
        ":1",
    ),
]


@pytest.mark.parametrize(
    ("rel", "fmt", "count", "question", "answers", "native_id", "loc"), CASES, ids=[c[0].split("/")[-1] for c in CASES]
)
def test_every_raw_format_reads(
    rel: str, fmt: str, count: int, question: str, answers: tuple[str, ...], native_id: str | None, loc: str
) -> None:
    path = RAW / rel
    assert detect_file_format(path) == fmt
    records = list(read_records(path))
    assert len(records) == count
    assert all(isinstance(r, QARecord) for r in records)
    first = records[0]
    assert isinstance(first, QARecord)
    assert (first.question, first.answers, first.native_id) == (question, answers, native_id)
    assert str(first.where) == f"{path}{loc}"
    # Naming the format explicitly gives the same records as detecting it.
    assert list(read_records(path, fmt)) == records


def test_every_fixture_file_is_covered() -> None:
    on_disk = {str(p.relative_to(RAW)) for p in RAW.rglob("*") if p.is_file()}
    assert on_disk == {c[0] for c in CASES}


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_bad_records_are_reported_with_file_and_line(tmp_path: Path) -> None:
    good = '{"question": "who wrote hamlet", "answer": ["Shakespeare"]}'
    path = _write_jsonl(
        tmp_path / "nq.jsonl",
        [
            good,
            '{"question": "broken", "answer": [',  # line 2: not JSON
            '{"question": "  ", "answer": ["x"]}',  # line 3: blank question
            '{"question": "who painted it", "answer": []}',  # line 4: no answer
            "",  # blank lines are skipped, but still counted for line numbers
            '{"question": "what is 2+2", "answer": [4]}',  # line 6: non-string answer
            '["not", "an", "object"]',  # line 7
        ],
    )
    items = list(read_records(path))
    assert isinstance(items[0], QARecord)
    bad = [(i.reason, str(i.where)) for i in items if isinstance(i, InvalidRecord)]
    assert bad == [
        (UNREADABLE, f"{path}:2"),
        (NO_QUESTION, f"{path}:3"),
        (NO_ANSWER, f"{path}:4"),
        (NO_ANSWER, f"{path}:6"),
        (UNREADABLE, f"{path}:7"),
    ]
    message = next(i for i in items if isinstance(i, InvalidRecord) and i.reason == NO_ANSWER).message()
    assert message.startswith(f"{path}:4: no_answer: field 'answer'")


def test_wrong_answer_type_for_named_format_is_an_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "h.jsonl", ['{"question": "q", "answer": "a string"}'])
    (item,) = read_records(path, "nq_open")
    assert isinstance(item, InvalidRecord) and item.reason == NO_ANSWER
    assert "expected a list of strings" in item.detail
    (item,) = read_records(path)  # detected as hotpotqa, where a string answer is right
    assert isinstance(item, QARecord) and item.answers == ("a string",)


def test_answers_are_stripped_and_deduplicated(tmp_path: Path) -> None:
    row = {"id": "x1", "question": "q", "answer": " Paris ", "answer_aliases": ["Paris", "", "City of Light"]}
    path = _write_jsonl(tmp_path / "m.jsonl", [json.dumps(row)])
    (item,) = read_records(path)
    assert isinstance(item, QARecord)
    assert item.answers == ("Paris", "City of Light") and item.native_id == "x1"


def test_ircot_number_and_date_answers(tmp_path: Path) -> None:
    row = {
        "question_id": "a",
        "question_text": "when?",
        "answers_objects": [
            {"number": "", "date": {"day": "4", "month": "July", "year": "1776"}, "spans": []},
            {"number": "13", "date": {"day": "", "month": "", "year": ""}, "spans": ["thirteen"]},
        ],
    }
    (item,) = read_records(_write_jsonl(tmp_path / "i.jsonl", [json.dumps(row)]))
    assert isinstance(item, QARecord) and item.answers == ("4 July 1776", "thirteen", "13")


def test_json_lines_in_a_json_file(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "lines.json", ['{"question": "a", "answer": "b"}', '{"question": "c", "answer": "d"}']
    )
    assert [str(r.where) for r in read_records(path)] == [f"{path}:1", f"{path}:2"]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("corpus.jsonl", '{"id": "0", "contents": "\\"T\\"\\ntext"}\n', "passage corpus"),
        ("titles.json", '{"Some title": ["A sentence."]}', "holds one JSON object"),
        ("odd.jsonl", '{"query": "q", "label": "a"}\n', "cannot tell the format"),
        ("data.csv", "question,answer\n", "unknown file type"),
        ("empty.jsonl", "not json\n", "no readable record"),
    ],
)
def test_unreadable_files_raise_format_error(tmp_path: Path, name: str, content: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(FormatError, match=expected):
        list(read_records(path))


def test_unknown_format_name_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="unknown format 'squad'.*flashrag"):
        list(read_records(RAW / "RUC-NLPIR__FlashRAG/test.jsonl", "squad"))
    with pytest.raises(FormatError, match="no such file"):
        list(read_records(tmp_path / "missing.jsonl"))
