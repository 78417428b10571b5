"""The Ray Serve retriever on a local two-node Ray cluster (``ray start --head`` + ``ray start --address``, one CPU
each): two Flat shards, one per node, answer ``POST /retrieve`` with the same top-k as one Flat index over the same
vectors searched in this process, and ``GET /health`` identifies the index as the one-process server does. On the
shared one-node deployment (``ray_serve_url``), ``POST /documents`` answers the one-process server's articles, one of
them crossing the shard boundary. ``python -m pytest tests/retriever_server/serve/test_ray_serve.py`` (about three
minutes).

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

from retriever_server.api.schemas import MAX_ARTICLE_CHARS
from retriever_server.api.service import CorpusArticles
from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.passages import split_contents
from retriever_server.retrievers.encoder import Encoder
from retriever_server.retrievers.sharded import merge_topk

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

ROWS = 600
DIM = 384
"""MiniLM's embedding width."""
SCORE_ATOL = reorder_tol(1536) + reorder_tol(DIM)
"""How far a served score may lie from this process's (4.6e-4): a score is ``q . p``, a dot product of float32 unit
vectors of dimension ``d = 384``.

- The replica embeds the query with the same fp32 ONNX export as this process, but maybe in another order (its own
  thread count, the request's batch): each component may move by ``reorder_tol(1536)`` (two orders of MiniLM's longest,
  1536-term sum; ``tests/numerics.py``) of a component's scale, which for a unit vector is ``1 / sqrt(d)`` (0.05, its
  RMS; not 1.0). So ``|dq| <= sqrt(d) * reorder_tol(1536) / sqrt(d) = reorder_tol(1536)``, and the score moves by at
  most ``|dq| |p| = reorder_tol(1536)`` (Cauchy-Schwarz).
- Each shard sums the ``d`` products ``q_i p_i`` in its own order: ``sum |q_i p_i| <= |q| |p| = 1``, so two orders
  differ by at most ``reorder_tol(d)``.

Measured: the encoder's alone-vs-batched drift is 4.5e-8 per component. Ranks whose scores lie within this bound may
come in either order (``assert_same_top_k``); with 1.0 for the component scale the bound was 16x wider (7.3e-3) and
let the hits of two shards swap at score gaps a merge bug leaves (``test_score_atol_catches_...``)."""
QUERIES = ["who wrote the theory of relativity", "capital city of australia", "largest planet in the solar system",
           "when did world war 2 end", "what is photosynthesis"]  # fmt: skip


def test_two_shards_on_two_nodes_match_one_index(
    tmp_path: Path, make_corpus: Callable[[int], Path], ray_cluster: Callable, ray_serve_shards: Callable
) -> None:
    corpus = make_corpus(ROWS)
    single = faiss.IndexFlatIP(DIM)
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


def test_sharded_articles_equal_the_one_process_ones(
    ray_serve_url: str, ray_serve_corpus: Path, tmp_path: Path
) -> None:
    """Each shard holds its own rows (``index_convert --shards 2 --corpus``); an article of 8 passages crosses row 300,
    and ``max_chars`` cuts it in either shard, exactly at the boundary, or not at all."""
    corpus = load_corpus(ray_serve_corpus, tmp_path / "stores")
    crossing = [i for i, c in enumerate(corpus.contents) if split_contents(c)[0] == "Crossing article"]
    assert crossing[0] < ROWS // 2 <= crossing[-1] and len(crossing) > 2
    one_process = CorpusArticles(corpus)
    ids = [str(i) for i in (0, crossing[0], ROWS // 2 - 1, ROWS // 2, crossing[-1], crossing[-1] + 1, ROWS - 1)]
    ids.append("no-such-id")
    in_shard0 = len(" ".join(split_contents(corpus.contents[i])[1] for i in crossing if i < ROWS // 2))
    whole = len(" ".join(split_contents(corpus.contents[i])[1] for i in crossing))
    answers: dict[int, list] = {}
    for max_chars in (1, 700, in_shard0, in_shard0 + 1, 2500, whole - 1, whole, MAX_ARTICLE_CHARS):
        r = httpx.post(f"{ray_serve_url}/documents", json={"ids": ids, "max_chars": max_chars}, timeout=60)
        assert r.status_code == 200, r.text
        answers[max_chars] = r.json()["result"]
        assert answers[max_chars] == one_process.articles(ids, max_chars), max_chars
    article = answers[whole][1]  # from the article's first row: its rows in both shards, whole
    assert article["passages"] == len(crossing) and not article["truncated"]
    assert article["text"].endswith(split_contents(corpus.contents[crossing[-1]])[1])
    assert answers[whole - 1][1]["truncated"] and answers[whole][-1] is None


def test_merge_fills_from_either_shard_and_skips_empty_slots() -> None:
    s, p = merge_topk(
        [np.array([[0.5, -np.inf]], np.float32), np.array([[0.9, 0.1]], np.float32)],
        [np.array([[3, -1]]), np.array([[10, 11]])],
        topk=4,
    )
    assert p.tolist() == [[10, 3, 11, -1]]
    assert s[0, :3].tolist() == pytest.approx([0.9, 0.5, 0.1]) and s[0, 3] == -np.inf


UNIT_SCALE_ATOL = 384**0.5 * reorder_tol(1536) + reorder_tol(DIM)
"""The bound this module had, with 1.0 for a unit vector's component scale (7.3e-3), to show what it let through."""


def _interleave(scores: list[np.ndarray], positions: list[np.ndarray], topk: int) -> tuple[np.ndarray, np.ndarray]:
    """The planted bug: a merge that takes the two shards' hits in turn (shard 0's best, shard 1's best, ...)."""
    q = len(scores[0])
    return np.stack(scores, axis=2).reshape(q, -1)[:, :topk], np.stack(positions, axis=2).reshape(q, -1)[:, :topk]


def test_score_atol_catches_a_merge_that_swaps_hits_of_two_shards() -> None:
    """Queries between a passage of each shard, the second shard's ~2e-3 closer: the two shards searched and merged
    as the replicas do pass ``SCORE_ATOL``; a merge that interleaves the shards puts the first shard's hit first and
    fails it, where the bound at component scale 1.0 let it through."""
    vectors = np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:ROWS].astype(np.float32)
    half = ROWS // 2
    firsts = np.array([3, 77, 150])  # in shard 0; each paired with its nearest passage in shard 1
    seconds = half + (vectors[firsts] @ vectors[half:].T).argmax(axis=1)
    cos = (vectors[firsts] * vectors[seconds]).sum(axis=1, keepdims=True)  # (Q, 1)
    # q ~ w p_first + p_second: q . p_second - q . p_first = (1 - w)(1 - cos) / |w p_first + p_second| ~ 2e-3
    weight = 1 - 2e-3 * np.sqrt(2 + 2 * cos) / (1 - cos)
    queries = weight * vectors[firsts] + vectors[seconds]
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    single = faiss.IndexFlatIP(DIM)
    single.add(vectors)
    scores, positions = single.search(queries, 2)
    assert positions.tolist() == np.stack([seconds, firsts], axis=1).tolist()
    gaps = scores[:, 0] - scores[:, 1]
    assert (gaps > SCORE_ATOL).all() and (gaps < UNIT_SCALE_ATOL).all(), gaps

    shard_scores, shard_positions = [], []
    for offset in (0, half):
        shard = faiss.IndexFlatIP(DIM)
        shard.add(vectors[offset : offset + half])
        s, p = shard.search(queries, 2)
        shard_scores.append(s)
        shard_positions.append(p + offset)
    merged, merged_positions = merge_topk(shard_scores, shard_positions, 2)
    assert_same_top_k(merged_positions, merged, positions, scores, SCORE_ATOL)

    bad_scores, bad_positions = _interleave(shard_scores, shard_positions, 2)
    assert_same_top_k(bad_positions, bad_scores, positions, scores, UNIT_SCALE_ATOL)  # what the old bound let through
    with pytest.raises(AssertionError):
        assert_same_top_k(bad_positions, bad_scores, positions, scores, SCORE_ATOL)
