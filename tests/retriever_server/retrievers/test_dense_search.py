"""Dense search: faiss takes the BLAS path for query batches (faiss 1.15's default left it to its per-query kernel,
9x slower on a Flat index), and that path returns the exact top-k.

    python -m pytest -q tests/retriever_server/retrievers/test_dense_search.py
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from numerics import assert_same_top_k, reorder_tol

from retriever_server.retrievers.dense import BLAS_QUERY_THRESHOLD, FaissDenseRetriever, build_faiss_index


class _Vectors:
    """An encoder stand-in that returns given unit vectors (the search path is what is tested)."""

    dim = 32
    model_name = "fixed"

    def __init__(self, queries: np.ndarray) -> None:
        self.queries = queries

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.queries[: len(queries)]


def _unit(rows: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, 32)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat"])
def test_batched_search_uses_blas_and_returns_the_exact_top_k(factory: str) -> None:
    faiss.cvar.distance_compute_blas_threshold = 128_000  # faiss 1.15's default
    passages, queries = _unit(2000, 0), _unit(64, 1)
    retriever = FaissDenseRetriever(build_faiss_index(passages, factory), _Vectors(queries), nprobe=16)  # type: ignore[arg-type]
    assert faiss.cvar.distance_compute_blas_threshold == BLAS_QUERY_THRESHOLD <= len(queries)
    scores, positions = retriever.search([f"q{i}" for i in range(len(queries))], 5)
    exact = queries @ passages.T  # (64, 2000)
    want = np.argsort(-exact, axis=1)[:, :5]
    # 32-term inner products of unit vectors (sum |a_i b_i| <= 1) in FAISS's blocking or numpy's (tests/numerics.py)
    tol = reorder_tol(passages.shape[1])
    assert_same_top_k(positions, scores, want, np.take_along_axis(exact, want, axis=1), tol)
    np.testing.assert_allclose(scores, np.take_along_axis(exact, positions, axis=1), rtol=0, atol=tol)  # truthful
