"""The shipped-dataset builder: deterministic bytes, disjoint train/test, gold-passage check against the corpus,
a manifest that matches the files, and the files in data/datasets/ equal to a rebuild from the raw snapshot.

Run: python -m pytest tests/data_prep/test_default_dataset.py -q
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from data_prep.build_default_dataset import DEFAULT_CORPUS, DEFAULT_OUT, Sizes, build, check_disjoint, main
from data_prep.formats import Location
from data_prep.qa_to_parquet import Question
from data_prep.rows import read_rows

FIXTURES = Path(__file__).parent / "fixtures"
RAW = FIXTURES / "raw"
CORPUS = FIXTURES / "corpus.jsonl.gz"
SIZES = Sizes(nq_test=2, hotpotqa_test=1)
FILES = [
    "nq_hotpotqa_mini/train.parquet",
    "nq_hotpotqa_mini/test.parquet",
    "eval/musique_test.parquet",
    "eval/2wikimultihopqa_test.parquet",
    "eval/bamboogle_test.parquet",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("datasets")
    return out, build(RAW, CORPUS, out, SIZES)


def test_files_and_counts(built: tuple[Path, dict]) -> None:
    out, manifest = built
    assert sorted(manifest["files"]) == sorted(FILES)
    counts = {name: info["rows_per_source"] for name, info in manifest["files"].items()}
    # Fixtures: 6 NQ oracle, 4 IRCoT + 2 HippoRAG HotpotQA, 2 MuSiQue, 3 2Wiki, 3 Bamboogle questions.
    assert counts == {
        "nq_hotpotqa_mini/train.parquet": {"hotpotqa": 5, "nq": 4},
        "nq_hotpotqa_mini/test.parquet": {"hotpotqa": 1, "nq": 2},
        "eval/musique_test.parquet": {"musique": 2},
        "eval/2wikimultihopqa_test.parquet": {"2wikimultihopqa": 3},
        "eval/bamboogle_test.parquet": {"bamboogle": 3},
    }
    for name, info in manifest["files"].items():
        rows = read_rows(out / name)
        assert len(rows) == info["rows"]
        assert {r["extra_info"]["split"] for r in rows} == {info["split"]}
        assert len({r["extra_info"]["id"] for r in rows}) == len(rows)
        assert info["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert json.loads((out / "MANIFEST.json").read_text()) == manifest


def test_hipporag_train_questions_never_go_to_test(built: tuple[Path, dict]) -> None:
    out, _ = built
    test_ids = {r["extra_info"]["id"] for r in read_rows(out / "nq_hotpotqa_mini/test.parquet")}
    train_ids = {r["extra_info"]["id"] for r in read_rows(out / "nq_hotpotqa_mini/train.parquet")}
    hipporag = json.loads((RAW / "OSU-NLP-Group__HippoRAG/hotpotqa_train.json").read_text())
    assert {f"hotpotqa-train-{r['_id']}" for r in hipporag} <= train_ids
    assert not {f"hotpotqa-test-{r['_id']}" for r in hipporag} & test_ids


def test_train_and_test_are_disjoint(built: tuple[Path, dict]) -> None:
    out, _ = built
    train = {r["question"].casefold() for r in read_rows(out / "nq_hotpotqa_mini/train.parquet")}
    for name in FILES[1:]:
        assert not train & {r["question"].casefold() for r in read_rows(out / name)}


def test_build_is_deterministic(built: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = built
    build(RAW, CORPUS, tmp_path, SIZES)
    for name in [*FILES, "MANIFEST.json"]:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_questions_without_gold_passage_in_corpus_are_dropped_and_counted(tmp_path: Path) -> None:
    # Remove one NQ gold passage ("Deadpool 2") from the corpus: its question must leave NQ and be counted.
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        lines = [line for line in f if not json.loads(line)["contents"].startswith('"Deadpool 2"')]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(lines), encoding="utf-8")
    manifest = build(RAW, corpus, tmp_path / "out", SIZES)
    nq_check = manifest["files"]["nq_hotpotqa_mini/train.parquet"]["evidence_check"]
    assert nq_check["nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz"] == {
        "kept_gold_in_corpus": 5,
        "dropped_gold_not_in_corpus": 1,
    }
    questions = [
        r["question"] for name in FILES[:2] for r in read_rows(tmp_path / "out" / name) if r["data_source"] == "nq"
    ]
    assert len(questions) == 5 and "when is the next deadpool movie being released?" not in questions


def test_overlap_between_train_and_test_fails_the_build() -> None:
    where = Location(Path("x.jsonl"), line=1)
    train = [Question("nq", "Who wrote Hamlet?", ("Shakespeare",), None, where)]
    test = [Question("nq", "who wrote hamlet", ("Shakespeare",), None, Location(Path("y.jsonl"), line=7))]
    with pytest.raises(ValueError, match="1 questions of t.parquet are also in train, e.g. y.jsonl:7 and x.jsonl:1"):
        check_disjoint(train, {"t.parquet": test})


def test_too_few_questions_for_test_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="only 6 questions can go to test, 7 asked"):
        build(RAW, CORPUS, tmp_path, Sizes(nq_test=7, hotpotqa_test=1))
    assert main(["--raw", str(tmp_path / "missing"), "--corpus", str(CORPUS), "--out", str(tmp_path)]) == 1
    assert "no such file" in capsys.readouterr().err


def test_shipped_files_equal_a_rebuild(shared_raw: Path, tmp_path: Path) -> None:
    """data/datasets/ must be what the builder makes from the raw snapshot (rebuild: see docs/data.md)."""
    manifest = build(shared_raw, DEFAULT_CORPUS, tmp_path)
    shipped = json.loads((DEFAULT_OUT / "MANIFEST.json").read_text())
    # Parquet bytes (and so their sha256) depend on the pyarrow version; the rows below are compared instead.
    for m in (manifest, shipped):
        for info in m["files"].values():
            info.pop("sha256")
    assert manifest == shipped, "data/datasets is stale: run python -m data_prep.build_default_dataset"
    for name in FILES:
        assert read_rows(tmp_path / name) == read_rows(DEFAULT_OUT / name), name
    total_bytes = sum(p.stat().st_size for p in DEFAULT_OUT.rglob("*") if p.is_file())
    assert total_bytes < 5_000_000
