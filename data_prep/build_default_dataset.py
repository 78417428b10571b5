"""Build the shipped mini benchmark under ``data/datasets/`` from the raw snapshot, deterministically.

Files written (all with the ``search`` template, rows as :mod:`data_prep.rows` describes):

- ``nq_hotpotqa_mini/{train,val,test}.parquet``: NQ questions from the lost-in-the-middle oracle file and
  HotpotQA questions from the IRCoT dev subsample and HippoRAG's train sample, kept only when every gold passage
  of the question is in the shipped corpus. Test takes a fixed number per source, validation (a slice of the
  training pool, for choosing settings and checkpoints) the next fixed number, the rest is train; HippoRAG's
  HotpotQA *train* questions never go to test.
- ``eval/musique_test.parquet`` (HippoRAG's MuSiQue sample, gold paragraphs checked against the corpus the same way),
  ``eval/2wikimultihopqa_test.parquet`` and ``eval/bamboogle_test.parquet`` (R1-Searcher's eval files; their
  evidence is not known to be in the corpus): evaluation only.
- ``gold_passages.jsonl``: for every question of the files whose sources record gold passages (NQ, HotpotQA,
  MuSiQue), ``{"file", "id", "corpus_ids"}``: the row id and the ids, in the shipped corpus, of its gold passages.
  Tests measure retrieval recall with it, so they need nothing outside the repository.
- ``MANIFEST.json``: per file the row counts per source, the inputs (path, repository, commit, sha256, licence),
  the selection rule, the evidence check, and the sha256 of the file.

The split is decided by sorting each source's questions by SHA-256 of ``SALT|source|question id`` and taking the
first ``n_test`` for test, then the first ``n_val`` of the rest for validation: it does not depend on file order,
and a rebuild from the same raw files gives the same bytes. No test or validation question (compared
case-insensitively after normalisation) may appear in train, nor a test question in validation; the build fails
if one does. The raw snapshot is not part of the repository; maintainers who have it run::

    python -m data_prep.build_default_dataset --raw <raw snapshot folder>  # --out data/datasets
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.build_corpus import normalise
from data_prep.qa_to_parquet import ConversionReport, InputSpec, Question, build_rows, collect
from data_prep.rows import normalise_question, question_key, write_rows
from retriever_server.passages import open_text, split_contents
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.templates import load_template

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "data" / "datasets"
DEFAULT_CORPUS = SHIPPED_CORPUS
SALT = "search-rl-default-dataset-v1"
TEMPLATE = "search"
COMMAND = "python -m data_prep.build_default_dataset --raw <raw snapshot>"
GOLD_FILE = "gold_passages.jsonl"

Passage = tuple[str, str]  # (title, text), whitespace-normalised as in build_corpus
CorpusIds = dict[Passage, str]  # every passage of the corpus -> its id


@dataclass(frozen=True)
class RawFile:
    """One raw input file, its provenance (from the raw snapshot's SOURCES.md) and how to read it."""

    rel: str
    """Path under the raw folder."""
    source: str
    fmt: str
    repo: str
    commit: str
    path_in_repo: str
    licence: str
    evidence: Callable[[Path], dict[str, list[Passage]]] | None = None
    """Gold passages per question key (see ``Question.key``), or None when the file carries none."""


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open_text(path) as f:
        yield from (json.loads(line) for line in f if line.strip())


def _json(path: Path) -> Any:
    with open_text(path) as f:
        return json.load(f)


def _passage(title: str, text: str) -> Passage:
    return normalise(title), normalise(text)


def _evidence_nq_oracle(path: Path) -> dict[str, list[Passage]]:
    return {
        question_key(normalise_question(r["question"])): [
            _passage(c["title"], c["text"]) for c in r["ctxs"] if c.get("isgold")
        ]
        for r in _jsonl(path)
    }


def _evidence_ircot(path: Path) -> dict[str, list[Passage]]:
    return {
        r["question_id"]: [_passage(c["title"], c["paragraph_text"]) for c in r["contexts"] if c["is_supporting"]]
        for r in _jsonl(path)
    }


def _evidence_hotpotqa(path: Path) -> dict[str, list[Passage]]:
    out = {}
    for r in _json(path):
        titles = {title for title, _ in r["supporting_facts"]}
        out[r["_id"]] = [_passage(title, "".join(sents)) for title, sents in r["context"] if title in titles]
    return out


def _evidence_musique(path: Path) -> dict[str, list[Passage]]:
    return {
        r["id"]: [_passage(p["title"], p["paragraph_text"]) for p in r["paragraphs"] if p["is_supporting"]]
        for r in _json(path)
    }


_NQ_LICENCE = "NQ: CC BY-SA 3.0; Wikipedia text: CC BY-SA"
_HOTPOT_LICENCE = "HotpotQA: CC BY-SA 4.0"
_HIPPORAG = {"repo": "OSU-NLP-Group/HippoRAG", "commit": "b144c46df14cabe5f5822d8caded4bec5f709461"}
_R1: dict[str, Any] = {"repo": "RUCAIBox/R1-Searcher", "commit": "631167cbb3c2464f805730e3e364a690f5b136d4"}
NQ_ORACLE = RawFile(
    rel="nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz",
    source="nq",
    fmt="dpr",
    repo="nelson-liu/lost-in-the-middle",
    commit="29b8a6d042ce29abccee3db1a73171a107d7e6af",
    path_in_repo="qa_data/nq-open-oracle.jsonl.gz",
    licence=f"{_NQ_LICENCE}; repository MIT",
    evidence=_evidence_nq_oracle,
)
HOTPOT_IRCOT = RawFile(
    rel="xindili-cmu__anlp-project-multihop/dev_subsampled.jsonl.gz",
    source="hotpotqa",
    fmt="ircot",
    repo="xindili-cmu/anlp-project-multihop",
    commit="df0d5757f42f098ab6026f40323e91c369307506",
    path_in_repo="processed_data/hotpotqa/dev_subsampled.jsonl",
    licence=f"{_HOTPOT_LICENCE}; repository Apache-2.0",
    evidence=_evidence_ircot,
)
HOTPOT_HIPPORAG = RawFile(
    rel="OSU-NLP-Group__HippoRAG/hotpotqa_train.json",
    source="hotpotqa",
    fmt="hotpotqa",
    **_HIPPORAG,
    path_in_repo="data/hotpotqa_train.json",
    licence=f"{_HOTPOT_LICENCE}; repository MIT",
    evidence=_evidence_hotpotqa,
)
MUSIQUE_HIPPORAG = RawFile(
    rel="OSU-NLP-Group__HippoRAG/musique_train.json",
    source="musique",
    fmt="musique",
    **_HIPPORAG,
    path_in_repo="data/musique_train.json",
    licence="MuSiQue: CC BY 4.0; repository MIT",
    evidence=_evidence_musique,
)
TWOWIKI_R1 = RawFile(
    rel="RUCAIBox__R1-Searcher/2wiki_500.jsonl",
    source="2wikimultihopqa",
    fmt="r1searcher",
    **_R1,
    path_in_repo="data/eval_set/2wiki_500.jsonl",
    licence="2WikiMultihopQA: licence not checked; repository MIT",
)
BAMBOOGLE_R1 = RawFile(
    rel="RUCAIBox__R1-Searcher/bamboogle.jsonl",
    source="bamboogle",
    fmt="r1searcher",
    **_R1,
    path_in_repo="data/eval_set/bamboogle.jsonl",
    licence="Bamboogle: licence not checked; repository MIT",
)


@dataclass(frozen=True)
class Sizes:
    """How many questions per source go to the NQ/HotpotQA test and validation splits (the rest is train)."""

    nq_test: int = 400
    hotpotqa_test: int = 200
    nq_val: int = 150
    hotpotqa_val: int = 50


@dataclass
class Pool:
    """Questions of one source, with the files they came from and what the evidence check removed."""

    questions: list[Question]
    files: list[RawFile]
    evidence: dict[str, dict[str, int]]
    """Per raw file (``RawFile.rel``) with gold passages: questions kept and dropped by the corpus check."""
    gold: dict[tuple[str, str], list[Passage]] = field(default_factory=dict)
    """Gold passages of each kept question, by ``(source, Question.key)``; empty when the files record none."""


def load_corpus_ids(corpus: Path) -> CorpusIds:
    """(title, text) of every passage of a corpus jsonl, normalised as build_corpus writes them, and its id."""
    return {split_contents(row["contents"]): str(row["id"]) for row in _jsonl(corpus)}


def _read(raw: Path, files: Sequence[RawFile], corpus_keys: CorpusIds | None) -> Pool:
    """Collect questions of ``files``; with ``corpus_keys``, keep only those whose gold passages are all in it."""
    questions: list[Question] = []
    evidence: dict[str, dict[str, int]] = {}
    kept_gold: dict[tuple[str, str], list[Passage]] = {}
    for rf in files:
        path = raw / rf.rel
        found = collect([InputSpec(rf.source, path, rf.fmt)], ConversionReport())
        if corpus_keys is None or rf.evidence is None:
            questions += found
            continue
        gold = rf.evidence(path)
        counts: Counter[str] = Counter()
        for q in found:
            passages = gold.get(q.key)
            if not passages:
                raise ValueError(f"{q.where}: no gold passage recorded for question {q.key!r}; cannot check it")
            if all(p in corpus_keys for p in passages):
                counts["kept_gold_in_corpus"] += 1
                questions.append(q)
                kept_gold[(q.source, q.key)] = passages
            else:
                counts["dropped_gold_not_in_corpus"] += 1
        evidence[rf.rel] = {k: counts[k] for k in ("kept_gold_in_corpus", "dropped_gold_not_in_corpus")}
    return Pool(questions, list(files), evidence, kept_gold)


def _split_order(q: Question) -> str:
    return hashlib.sha256(f"{SALT}|{q.source}|{q.key}".encode()).hexdigest()


def split_pool(
    questions: Sequence[Question], n_test: int, train_only: set[Path], n_val: int = 0
) -> tuple[list[Question], list[Question], list[Question]]:
    """Deterministic split into (train, val, test): the first ``n_test`` questions by hash order go to test, the
    first ``n_val`` of the others to validation, the rest to train.

    Questions read from a path in ``train_only`` are never put in test (they may go to validation, a train slice).

    Raises:
        ValueError: fewer eligible questions than ``n_test``, or fewer left than ``n_val``.
    """
    ordered = sorted(questions, key=_split_order)
    eligible = [q for q in ordered if q.where.path not in train_only]
    if len(eligible) < n_test:
        raise ValueError(f"only {len(eligible)} questions can go to test, {n_test} asked")
    test = eligible[:n_test]
    test_keys = {id(q) for q in test}
    rest = [q for q in ordered if id(q) not in test_keys]
    if len(rest) < n_val:
        raise ValueError(f"only {len(rest)} questions are left for validation, {n_val} asked")
    return rest[n_val:], rest[:n_val], test


def _overlap_key(question: str) -> str:
    return question.casefold().rstrip("?").strip()


def check_disjoint(train: Sequence[Question], tests: dict[str, Sequence[Question]], train_name: str = "train") -> None:
    """Raise ValueError if any test question also occurs in ``train`` (case-insensitive, trailing ``?`` ignored)."""
    seen = {_overlap_key(q.question): q for q in train}
    for name, questions in tests.items():
        clash = [(q, seen[_overlap_key(q.question)]) for q in questions if _overlap_key(q.question) in seen]
        if clash:
            q, t = clash[0]
            raise ValueError(
                f"{len(clash)} questions of {name} are also in {train_name}, "
                f"e.g. {q.where} and {t.where}: {q.question!r}"
            )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _input_entry(raw: Path, rf: RawFile) -> dict[str, str]:
    return {
        "file": rf.rel,
        "source": rf.source,
        "format": rf.fmt,
        "repository": rf.repo,
        "commit": rf.commit,
        "path_in_repository": rf.path_in_repo,
        "licence": rf.licence,
        "sha256": _sha256(raw / rf.rel),
    }


@dataclass(frozen=True)
class FilePlan:
    """What goes into one shipped file, and from where."""

    split: str
    questions: list[Question]
    pools: list[Pool]
    selection: str


def plan_files(raw: Path, corpus_keys: CorpusIds, sizes: Sizes) -> dict[str, FilePlan]:
    """Decide the questions of every shipped file (path under the output folder -> plan)."""
    nq = _read(raw, [NQ_ORACLE], corpus_keys)
    hotpot = _read(raw, [HOTPOT_IRCOT, HOTPOT_HIPPORAG], corpus_keys)
    nq_train, nq_val, nq_test = split_pool(nq.questions, sizes.nq_test, set(), sizes.nq_val)
    hp_train, hp_val, hp_test = split_pool(
        hotpot.questions, sizes.hotpotqa_test, {raw / HOTPOT_HIPPORAG.rel}, sizes.hotpotqa_val
    )
    rule = (
        f"questions whose gold passages are all in the corpus, sorted per source by sha256('{SALT}|<source>|"
        f"<question id>'); the first {sizes.nq_test} nq and {sizes.hotpotqa_test} hotpotqa go to test (HippoRAG "
        f"train questions never do), the next {sizes.nq_val} nq and {sizes.hotpotqa_val} hotpotqa to val, "
        "the rest to train"
    )
    plan = {
        "nq_hotpotqa_mini/train.parquet": FilePlan("train", nq_train + hp_train, [nq, hotpot], rule),
        "nq_hotpotqa_mini/val.parquet": FilePlan("val", nq_val + hp_val, [nq, hotpot], rule),
        "nq_hotpotqa_mini/test.parquet": FilePlan("test", nq_test + hp_test, [nq, hotpot], rule),
    }
    for name, files, keys in [
        ("musique", [MUSIQUE_HIPPORAG], corpus_keys),
        ("2wikimultihopqa", [TWOWIKI_R1], None),
        ("bamboogle", [BAMBOOGLE_R1], None),
    ]:
        pool = _read(raw, files, keys)
        chosen = "questions whose gold paragraphs are all in the corpus" if pool.evidence else "all questions"
        plan[f"eval/{name}_test.parquet"] = FilePlan("test", pool.questions, [pool], f"{chosen}; evaluation only")
    tests: dict[str, Sequence[Question]] = {name: p.questions for name, p in plan.items() if p.split == "test"}
    val = plan["nq_hotpotqa_mini/val.parquet"].questions
    check_disjoint(plan["nq_hotpotqa_mini/train.parquet"].questions, {**tests, "nq_hotpotqa_mini/val.parquet": val})
    check_disjoint(val, tests, train_name="nq_hotpotqa_mini/val.parquet")
    return plan


def _shown_path(path: Path) -> str:
    """``path`` relative to the repository when inside it, so the manifest does not depend on the checkout."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def gold_rows(name: str, rows: Sequence[dict[str, Any]], plan: FilePlan, corpus_ids: CorpusIds) -> list[dict]:
    """``{"file", "id", "corpus_ids"}`` per row of a file whose questions have known gold passages (else none)."""
    gold = {k: v for pool in plan.pools for k, v in pool.gold.items()}
    if not gold:
        return []
    return [
        {"file": name, "id": row["extra_info"]["id"], "corpus_ids": [corpus_ids[p] for p in gold[(q.source, q.key)]]}
        for row, q in zip(rows, plan.questions, strict=True)
    ]


def build(raw: Path, corpus: Path, out: Path, sizes: Sizes = Sizes()) -> dict[str, Any]:
    """Build every shipped file under ``out`` and return the manifest (also written to ``out/MANIFEST.json``)."""
    template = load_template(TEMPLATE)
    corpus_keys = load_corpus_ids(corpus)
    files: dict[str, Any] = {}
    gold: list[dict[str, Any]] = []
    for name, plan in plan_files(raw, corpus_keys, sizes).items():
        rows = build_rows(plan.questions, plan.split, template)
        write_rows(rows, out / name)
        gold += gold_rows(name, rows, plan, corpus_keys)
        files[name] = {
            "split": plan.split,
            "rows": len(rows),
            "rows_per_source": dict(sorted(Counter(r["data_source"] for r in rows).items())),
            "selection": plan.selection,
            "evidence_check": {rel: counts for p in plan.pools for rel, counts in p.evidence.items()},
            "inputs": [_input_entry(raw, rf) for p in plan.pools for rf in p.files],
            "sha256": _sha256(out / name),
        }
    manifest = {
        "description": "search-rl default mini benchmark; see docs/data.md",
        "command": COMMAND,
        "builder": "data_prep/build_default_dataset.py",
        "template": {"name": TEMPLATE, "file": _shown_path(template.path), "sha256": _sha256(template.path)},
        "corpus": {"file": _shown_path(corpus), "passages": len(corpus_keys), "sha256": _sha256(corpus)},
        "train_test_disjoint": "checked: no test or val question (case-insensitive, trailing '?' ignored) occurs in "
        "train, and no test question in val",
        "files": files,
        "gold_passages": {
            "file": GOLD_FILE,
            "rows": len(gold),
            "description": "per question of the files above whose sources record gold passages: the row id and the "
            "corpus ids of its gold passages (all of them are in the corpus)",
            "sha256": _write_gold(gold, out / GOLD_FILE),
        },
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def _write_gold(rows: list[dict[str, Any]], path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return _sha256(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.build_default_dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--raw", type=Path, required=True, help="raw snapshot folder (not in the repository)")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="shipped corpus (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        manifest = build(args.raw, args.corpus, args.out)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, info in manifest["files"].items():
        print(f"{name}: {info['rows']} rows {info['rows_per_source']} evidence {info['evidence_check'] or '-'}")
    print(f"wrote {args.out / 'MANIFEST.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
