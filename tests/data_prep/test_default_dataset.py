"""The shipped-dataset builder (on the raw-file fixtures): deterministic bytes, disjoint train/test, gold-passage
check against the corpus, a gold-passage file; and the files in data/datasets/: equal to what their manifest records,
disjoint, with gold passages that are in the shipped corpus. Nothing here reads outside the repository.

Run: python -m pytest tests/data_prep/test_default_dataset.py -q
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from data_prep.build_default_dataset import (
    DEFAULT_CORPUS,
    DEFAULT_OUT,
    GOLD_FILE,
    REPO_ROOT,
    Sizes,
    build,
    check_disjoint,
    main,
)
from data_prep.formats import Location
from data_prep.qa_to_parquet import Question
from data_prep.rows import read_rows

FIXTURES = Path(__file__).parent / "fixtures"
RAW = FIXTURES / "raw"
CORPUS = FIXTURES / "corpus.jsonl.gz"
SIZES = Sizes(nq_test=2, hotpotqa_test=1, nq_val=1, hotpotqa_val=1)
FILES = [
    "nq_hotpotqa_mini/train.parquet",
    "nq_hotpotqa_mini/val.parquet",
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
        "nq_hotpotqa_mini/train.parquet": {"hotpotqa": 4, "nq": 3},
        "nq_hotpotqa_mini/val.parquet": {"hotpotqa": 1, "nq": 1},
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
    pool = ("train", "val")
    train_ids = {r["extra_info"]["id"] for s in pool for r in read_rows(out / f"nq_hotpotqa_mini/{s}.parquet")}
    hipporag = json.loads((RAW / "OSU-NLP-Group__HippoRAG/hotpotqa_train.json").read_text())
    assert {i.split("-", 2)[2] for i in train_ids} >= {r["_id"] for r in hipporag}  # train or val (ids name the split)
    assert not {f"hotpotqa-test-{r['_id']}" for r in hipporag} & test_ids


def test_train_val_and_test_are_disjoint(built: tuple[Path, dict]) -> None:
    out, _ = built
    train = {r["question"].casefold() for r in read_rows(out / "nq_hotpotqa_mini/train.parquet")}
    val = {r["question"].casefold() for r in read_rows(out / "nq_hotpotqa_mini/val.parquet")}
    for name in FILES[1:]:
        assert not train & {r["question"].casefold() for r in read_rows(out / name)}
    for name in FILES[2:]:
        assert not val & {r["question"].casefold() for r in read_rows(out / name)}


def test_validation_is_the_next_slice_of_the_hash_order(built: tuple[Path, dict], tmp_path: Path) -> None:
    """Asking for one more validation question moves the next train question (in hash order) to val; test stays."""
    out, _ = built
    more = build(RAW, CORPUS, tmp_path, Sizes(nq_test=2, hotpotqa_test=1, nq_val=2, hotpotqa_val=1))
    ids = {  # <source>-<split>-<key>: compared without the split, which names the file
        (d, name): {re.sub(r"-(train|val|test)-", "-", r["extra_info"]["id"], count=1) for r in read_rows(d / name)}
        for d in (out, tmp_path)
        for name in FILES[:3]
    }
    train, val, test = (f"nq_hotpotqa_mini/{s}.parquet" for s in ("train", "val", "test"))
    assert ids[(tmp_path, test)] == ids[(out, test)]
    moved = ids[(tmp_path, val)] - ids[(out, val)]
    assert len(moved) == 1 and moved <= ids[(out, train)] and ids[(out, val)] <= ids[(tmp_path, val)]
    assert ids[(tmp_path, train)] == ids[(out, train)] - moved
    assert more["files"][val]["rows_per_source"] == {"hotpotqa": 1, "nq": 2}
    with pytest.raises(ValueError, match="only 4 questions are left for validation, 5 asked"):
        build(RAW, CORPUS, tmp_path / "x", Sizes(nq_test=2, hotpotqa_test=1, nq_val=5, hotpotqa_val=1))


def test_build_is_deterministic(built: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = built
    build(RAW, CORPUS, tmp_path, SIZES)
    for name in [*FILES, GOLD_FILE, "MANIFEST.json"]:
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
        r["question"] for name in FILES[:3] for r in read_rows(tmp_path / "out" / name) if r["data_source"] == "nq"
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corpus_by_id(path: Path) -> dict[str, str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {row["id"]: row["contents"] for row in map(json.loads, f)}


def _words(text: str) -> str:
    return " " + re.sub(r"\W+", " ", text.casefold()).strip() + " "


def test_gold_file_names_the_raw_gold_passages(built: tuple[Path, dict]) -> None:
    out, manifest = built
    corpus = _corpus_by_id(CORPUS)
    gold = [json.loads(line) for line in (out / GOLD_FILE).read_text().splitlines()]
    assert manifest["gold_passages"]["rows"] == len(gold)
    with_evidence = [name for name, info in manifest["files"].items() if info["evidence_check"]]
    assert sorted(with_evidence) == sorted(FILES[:4])  # 2Wiki and Bamboogle record no gold passages
    for name in with_evidence:
        ids = [r["extra_info"]["id"] for r in read_rows(out / name)]
        assert [g["id"] for g in gold if g["file"] == name] == ids, name
    # The NQ oracle marks one gold context per question; the file must point at exactly that passage.
    oracle = {}
    with gzip.open(RAW / "nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz", "rt") as f:
        for row in map(json.loads, f):
            ctx = next(c for c in row["ctxs"] if c.get("isgold"))
            oracle[row["question"].rstrip("?").casefold()] = f'"{ctx["title"]}"\n{" ".join(ctx["text"].split())}'
    questions = {r["extra_info"]["id"]: r["question"] for name in FILES[:3] for r in read_rows(out / name)}
    nq = [g for g in gold if g["id"].startswith("nq-")]
    assert len(nq) == 6
    for g in nq:
        (passage_id,) = g["corpus_ids"]
        assert corpus[passage_id] == oracle[questions[g["id"]].rstrip("?").casefold()]


def test_shipped_files_match_their_manifest() -> None:
    """data/datasets/ is what MANIFEST.json records (a maintainer rebuild from the raw snapshot: docs/data.md)."""
    manifest = json.loads((DEFAULT_OUT / "MANIFEST.json").read_text())
    assert sorted(manifest["files"]) == sorted(FILES)
    assert manifest["corpus"]["sha256"] == _sha256(DEFAULT_CORPUS), "the shipped corpus changed: rebuild data/datasets"
    assert manifest["template"]["sha256"] == _sha256(REPO_ROOT / manifest["template"]["file"])
    train_questions = {r["question"].casefold().rstrip("?").strip() for r in read_rows(DEFAULT_OUT / FILES[0])}
    for name, info in manifest["files"].items():
        assert info["sha256"] == _sha256(DEFAULT_OUT / name), f"{name} differs from MANIFEST.json"
        rows = read_rows(DEFAULT_OUT / name)
        assert len(rows) == info["rows"]
        assert dict(Counter(r["data_source"] for r in rows)) == info["rows_per_source"]
        assert {r["extra_info"]["split"] for r in rows} == {info["split"]}
        if info["split"] in ("val", "test"):
            assert not train_questions & {r["question"].casefold().rstrip("?").strip() for r in rows}, name
    assert manifest["gold_passages"]["sha256"] == _sha256(DEFAULT_OUT / GOLD_FILE)
    sizes = {p: p.stat().st_size for p in (REPO_ROOT / "data").rglob("*") if p.is_file()}
    assert max(sizes.values()) < 5_000_000, max(sizes, key=sizes.__getitem__)
    assert sum(p.stat().st_size for p in DEFAULT_OUT.rglob("*") if p.is_file()) < 5_000_000


def test_gold_passages_of_shipped_files_are_in_the_shipped_corpus() -> None:
    """Every NQ/HotpotQA/MuSiQue question has its gold passages in the corpus, and they hold its answer."""
    corpus = _corpus_by_id(DEFAULT_CORPUS)
    with (DEFAULT_OUT / GOLD_FILE).open() as f:
        gold = {(g["file"], g["id"]): g["corpus_ids"] for g in map(json.loads, f)}
    checked: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    for name in FILES[:4]:
        for r in read_rows(DEFAULT_OUT / name):
            ids = gold.pop((name, r["extra_info"]["id"]))
            assert ids and all(i in corpus for i in ids), (name, r["extra_info"]["id"])
            assert len(ids) == (1 if r["data_source"] == "nq" else len(set(ids))) and len(ids) <= 4
            answers = {_words(a) for a in r["reward_model"]["ground_truth"]["target"]}
            if answers <= {" yes ", " no "}:  # HotpotQA comparison questions: the answer is not quoted text
                continue
            text = _words(" ".join(corpus[i] for i in ids))
            checked[r["data_source"]] += 1
            answered[r["data_source"]] += any(a in text for a in answers)
    assert not gold, f"{len(gold)} gold rows name questions that are in no shipped file"
    assert set(checked) == {"nq", "hotpotqa", "musique"}
    assert answered["nq"] == checked["nq"], "an NQ oracle passage always holds the answer"
    for source in ("hotpotqa", "musique"):  # a multi-hop answer may be paraphrased ("American" for "United States")
        assert answered[source] >= 0.95 * checked[source], source
