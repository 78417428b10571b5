"""Recall of dense, BM25 and hybrid retrieval on the NQ questions of the shipped test split, whose gold passages are
in the shipped corpus (``data/datasets/gold_passages.jsonl``):
``python -m pytest tests/retriever_server/retrievers/test_retrieval_quality.py -s`` (prints the figures).

The floors are the figures measured on the shipped data (see docs/retriever.md) minus a small margin, so a
regression in encoding, the shipped embeddings, tokenisation, fusion or the corpus build fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.build_default_dataset import DEFAULT_OUT, GOLD_FILE
from data_prep.rows import read_rows
from retriever_server.index.build import load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.retrievers.quality import recall_at_k
from retriever_server.settings import SHIPPED_CORPUS, Settings

pytestmark = pytest.mark.slow

TEST_SPLIT = "nq_hotpotqa_mini/test.parquet"
# method -> (recall@1 floor, recall@3 floor); measured 0.765/0.865, 0.875/0.968, 0.840/0.943 (docs/retriever.md)
FLOORS = {"bm25": (0.74, 0.84), "dense": (0.85, 0.94), "hybrid": (0.81, 0.92)}


def nq_test_gold() -> tuple[list[str], list[int]]:
    """The NQ questions of the shipped test split and the corpus position of each one's gold passage."""
    position = {doc_id: i for i, doc_id in enumerate(load_corpus(SHIPPED_CORPUS).ids)}
    with (DEFAULT_OUT / GOLD_FILE).open() as f:
        gold = {g["id"]: g["corpus_ids"] for g in map(json.loads, f) if g["file"] == TEST_SPLIT}
    questions, positions = [], []
    for row in read_rows(DEFAULT_OUT / TEST_SPLIT):
        if row["data_source"] == "nq":
            (passage_id,) = gold[row["extra_info"]["id"]]
            questions.append(row["question"])
            positions.append(position[passage_id])
    return questions, positions


@pytest.fixture(scope="module")
def nq_gold() -> tuple[list[str], list[int]]:
    return nq_test_gold()


@pytest.mark.parametrize("method", ["bm25", "dense", "hybrid"])
def test_recall_floor(method: str, nq_gold: tuple[list[str], list[int]], index_cache_dir: Path) -> None:
    settings = Settings(method=method, index_dir=index_cache_dir, show_progress=False)  # type: ignore[arg-type]
    retriever = load_retriever(load_corpus(SHIPPED_CORPUS), settings)
    questions, gold = nq_gold
    assert len(questions) >= 300
    recall = recall_at_k(retriever, questions, gold, ks=(1, 3))
    print(f"\n{method}: recall@1={recall[1]:.3f} recall@3={recall[3]:.3f} over {len(questions)} NQ test questions")
    floor1, floor3 = FLOORS[method]
    assert recall[1] >= floor1 and recall[3] >= floor3
    assert recall[3] >= recall[1]
