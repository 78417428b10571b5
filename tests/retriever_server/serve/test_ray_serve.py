"""The Ray Serve retriever on a local two-node Ray cluster (``ray start --head`` + ``ray start --address``, one CPU
each): two Flat shards, one per node, answer ``POST /retrieve`` with the same top-k as one Flat index over the same
vectors searched in this process, and ``GET /health`` identifies the index as the one-process server does.
``python -m pytest tests/retriever_server/serve/test_ray_serve.py`` (about two minutes).

The request path (limits, error answers, guard, cache, shedding) is the one-process server's; the schema fuzz and
the poison-query tests in ``tests/retriever_server/api/`` run against both servers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest
from numerics import assert_same_top_k, reorder_tol

from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.retrievers.encoder import Encoder
from retriever_server.retrievers.sharded import merge_topk

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

ROWS = 600
SCORE_ATOL = 384**0.5 * reorder_tol(1536) + reorder_tol(384)
"""How far a served score may lie from this process's: the replicas embed the queries with the server's encoder
backend, whose components may each lie ``reorder_tol(1536)`` (MiniLM's longest sum) from torch's, so a unit query
moves by up to ``sqrt(384)`` times that, and a unit passage's score with it (Cauchy-Schwarz); then the 384-term inner
product is summed in each shard's order (tests/numerics.py)."""
QUERIES = ["who wrote the theory of relativity", "capital city of australia", "largest planet in the solar system",
           "when did world war 2 end", "what is photosynthesis"]  # fmt: skip


def test_two_shards_on_two_nodes_match_one_index(
    tmp_path: Path, make_corpus: Callable[[int], Path], ray_cluster: Callable, ray_serve_shards: Callable
) -> None:
    corpus = make_corpus(ROWS)
    single = faiss.IndexFlatIP(384)
    single.add(np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:ROWS].astype(np.float32))
    scores, positions = single.search(Encoder("all-MiniLM-L6-v2").encode_queries(QUERIES), 5)
    rows = load_corpus(corpus, tmp_path / "stores")
    expected = [[rows.document(int(p)) for p in row] for row in positions]

    # one CPU per node and one per shard replica: the two shards must go to different nodes
    with ray_cluster(tmp_path, nodes=2) as address, ray_serve_shards(tmp_path, corpus, ROWS, address, (0, 1)) as served:
        url, health = served
        body = {"queries": QUERIES, "topk": 5, "return_scores": True}
        answer = httpx.post(f"{url}/retrieve", json=body, timeout=60)
        bad = httpx.post(f"{url}/retrieve", json={"queries": [""]}, timeout=60)
        whole = httpx.post(f"{url}/retrieve", json={"queries": QUERIES[:1], "topk": 5.0}, timeout=60)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "queries", 0], bad.text
    assert whole.status_code == 200 and whole.json()["result"] == [[h["document"] for h in result[0]]]
    assert health["num_documents"] == ROWS
    assert [(s["rows"], s["offset"]) for s in health["shards"]] == [(300, 0), (300, 300)]
    assert health["shards"][0]["node"] != health["shards"][1]["node"], "both shards ran on one node"
    served = [[hit["score"] for hit in row] for row in result]
    assert_same_top_k([[hit["document"] for hit in row] for row in result], served, expected, scores, SCORE_ATOL)
    assert any(p >= 300 for p in positions.ravel()) and any(p < 300 for p in positions.ravel())
    assert health["index_key"].startswith("shards-") and len(health["corpus_sha256"]) == 64
    assert health["search_settings"]["encoder_model"] == "all-MiniLM-L6-v2"
    assert health["search_settings"]["encoder_backend"] == "onnx"  # auto, for the shipped MiniLM on CPU


def test_merge_fills_from_either_shard_and_skips_empty_slots() -> None:
    s, p = merge_topk(
        [np.array([[0.5, -np.inf]], np.float32), np.array([[0.9, 0.1]], np.float32)],
        [np.array([[3, -1]]), np.array([[10, 11]])],
        topk=4,
    )
    assert p.tolist() == [[10, 3, 11, -1]]
    assert s[0, :3].tolist() == pytest.approx([0.9, 0.5, 0.1]) and s[0, 3] == -np.inf
