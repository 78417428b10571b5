"""Hybrid retrieval: reciprocal rank fusion (Cormack et al., 2009) of a dense and a BM25 ranking."""

from __future__ import annotations

import numpy as np

from retriever_server.retrievers.base import Retriever


def reciprocal_rank_fusion(rankings: list[np.ndarray], topk: int, rrf_k: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Fuse rankings (each ``(Q, n)`` positions, best first, -1 = empty) by ``sum 1 / (rrf_k + rank)``.

    Ties are broken by the smaller corpus position so results are deterministic.

    >>> s, p = reciprocal_rank_fusion([np.array([[3, 1]]), np.array([[1, 2]])], topk=2, rrf_k=60)
    >>> p.tolist()
    [[1, 3]]
    """
    num_q = rankings[0].shape[0]
    out_scores = np.full((num_q, topk), -np.inf, dtype=np.float32)
    out_pos = np.full((num_q, topk), -1, dtype=np.int64)
    for q in range(num_q):
        fused: dict[int, float] = {}
        for ranking in rankings:
            for rank, pos in enumerate(ranking[q].tolist(), start=1):
                if pos >= 0:
                    fused[pos] = fused.get(pos, 0.0) + 1.0 / (rrf_k + rank)
        best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:topk]
        for j, (pos, score) in enumerate(best):
            out_pos[q, j] = pos
            out_scores[q, j] = score
    return out_scores, out_pos


class HybridRetriever:
    """Asks each component for ``candidates`` results and fuses them with RRF."""

    name = "hybrid"

    def __init__(self, dense: Retriever, sparse: Retriever, rrf_k: int = 60, candidates: int = 50) -> None:
        self.dense = dense
        self.sparse = sparse
        self.rrf_k = rrf_k
        self.candidates = candidates

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        n = max(self.candidates, topk)
        _, dense_pos = self.dense.search(queries, n)
        _, sparse_pos = self.sparse.search(queries, n)
        return reciprocal_rank_fusion([dense_pos, sparse_pos], topk, self.rrf_k)
