"""Shards of one corpus: each index holds a consecutive range of corpus rows; their top-k lists merge into one.

The Ray Serve deployment (``retriever_server.serve.deployment``) fans a query batch out to shard replicas and merges
with :func:`merge_topk`; :class:`ShardedIndex` does the same in one process (tests, and a machine that holds every
shard).
"""

from __future__ import annotations

import numpy as np


def merge_topk(scores: list[np.ndarray], positions: list[np.ndarray], topk: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard results (each ``(Q, k_s)``, global positions, -1 = empty) into the best ``topk`` per query.

    Higher scores first; equal scores by the smaller position, so the merge does not depend on shard order.

    >>> s, p = merge_topk([np.array([[0.9, 0.5]]), np.array([[0.7, 0.5]])], [np.array([[4, 1]]), np.array([[9, 0]])], 3)
    >>> p.tolist(), s.tolist()
    ([[4, 9, 0]], [[0.8999999761581421, 0.699999988079071, 0.5]])
    """
    all_scores = np.concatenate([np.asarray(s, dtype=np.float32) for s in scores], axis=1)  # (Q, sum k_s)
    all_pos = np.concatenate([np.asarray(p, dtype=np.int64) for p in positions], axis=1)  # (Q, sum k_s)
    all_scores = np.where(all_pos >= 0, all_scores, -np.inf).astype(np.float32)
    out_scores = np.full((all_pos.shape[0], topk), -np.inf, dtype=np.float32)
    out_pos = np.full((all_pos.shape[0], topk), -1, dtype=np.int64)
    for q in range(all_pos.shape[0]):
        order = np.lexsort((all_pos[q], -all_scores[q]))  # primary: score descending; ties: position ascending
        keep = [j for j in order if all_pos[q, j] >= 0][:topk]
        out_scores[q, : len(keep)] = all_scores[q, keep]
        out_pos[q, : len(keep)] = all_pos[q, keep]
    return out_scores, out_pos


class ShardedIndex:
    """Several FAISS indexes over consecutive row ranges, searched as one (``search`` like ``faiss.Index``)."""

    def __init__(self, shards: list, offsets: list[int]) -> None:  # type: ignore[type-arg]
        if len(shards) != len(offsets) or not shards:
            raise ValueError(f"{len(shards)} shards but {len(offsets)} offsets")
        self.shards, self.offsets = shards, offsets
        self.d = int(shards[0].d)
        self.ntotal = sum(int(s.ntotal) for s in shards)

    def search(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k over every shard, positions global."""
        scores, positions = [], []
        for shard, offset in zip(self.shards, self.offsets, strict=True):
            s, p = shard.search(vectors, topk)
            scores.append(s)
            positions.append(np.where(p >= 0, p + offset, -1))
        return merge_topk(scores, positions, topk)
