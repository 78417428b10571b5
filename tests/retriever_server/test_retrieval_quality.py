"""Recall of dense, BM25 and hybrid retrieval on the NQ questions whose gold passage is in the shipped corpus:
``python -m pytest tests/retriever_server/test_retrieval_quality.py -s`` (prints the figures).

The floors are the figures measured on the shipped corpus (see docs/retriever.md) minus a small margin, so a
regression in encoding, tokenisation, fusion or the corpus build fails here.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from data_prep.build_corpus import normalise
from retriever_server.build_index import load_retriever
from retriever_server.corpus import load_corpus
from retriever_server.evaluation import recall_at_k
from retriever_server.settings import SHIPPED_CORPUS, Settings

pytestmark = pytest.mark.slow

# method -> (recall@1 floor, recall@3 floor)
FLOORS = {"bm25": (0.68, 0.81), "dense": (0.84, 0.95), "hybrid": (0.79, 0.91)}


@pytest.fixture(scope="module")
def nq_gold(shared_raw: Path) -> tuple[list[str], list[int]]:
    corpus = load_corpus(SHIPPED_CORPUS)
    position = {c: i for i, c in enumerate(corpus.contents)}
    questions, gold = [], []
    with gzip.open(shared_raw / "nelson-liu__lost-in-the-middle" / "nq-open-oracle.jsonl.gz", "rt") as f:
        for line in f:
            row = json.loads(line)
            ctx = next(c for c in row["ctxs"] if c.get("isgold"))
            questions.append(row["question"])
            gold.append(position[f'"{normalise(ctx["title"])}"\n{normalise(ctx["text"])}'])
    return questions, gold


@pytest.mark.parametrize("method", ["bm25", "dense", "hybrid"])
def test_recall_floor(method: str, nq_gold: tuple[list[str], list[int]], shared_index_dir: Path) -> None:
    settings = Settings(method=method, index_dir=shared_index_dir, show_progress=False)  # type: ignore[arg-type]
    retriever = load_retriever(load_corpus(SHIPPED_CORPUS), settings)
    questions, gold = nq_gold
    recall = recall_at_k(retriever, questions, gold, ks=(1, 3))
    print(f"\n{method}: recall@1={recall[1]:.3f} recall@3={recall[3]:.3f} over {len(questions)} NQ questions")
    floor1, floor3 = FLOORS[method]
    assert recall[1] >= floor1 and recall[3] >= floor3
    assert recall[3] >= recall[1]
