"""The query batcher and the search service over a real BM25 index:
``python -m pytest tests/retriever_server/test_batching.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from retriever_server.batching import QueryBatcher
from retriever_server.build_index import load_retriever
from retriever_server.corpus import load_corpus
from retriever_server.metrics import ServiceMetrics
from retriever_server.retrievers.base import Retriever
from retriever_server.service import SearchService
from retriever_server.settings import Settings


class CountingRetriever:
    """Wraps a real retriever and records the size of every batch it is asked to search."""

    name = "counting"

    def __init__(self, inner: Retriever, fail_first: bool = False) -> None:
        self.inner = inner
        self.calls: list[int] = []
        self.fail_first = fail_first

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        self.calls.append(len(queries))
        if self.fail_first and len(self.calls) == 1:
            raise RuntimeError("index on fire")  # a backend failure we cannot otherwise provoke
        return self.inner.search(queries, topk)


@pytest.fixture
def bm25(tmp_path: Path, small_corpus: Path) -> tuple[Retriever, object]:
    s = Settings(corpus_path=small_corpus, index_dir=tmp_path / "idx", method="bm25", show_progress=False)  # type: ignore[arg-type]
    corpus = load_corpus(small_corpus)
    return load_retriever(corpus, s), corpus


def test_concurrent_searches_are_coalesced_and_equal_direct_search(bm25: tuple[Retriever, object]) -> None:
    retriever, corpus = bm25
    counting = CountingRetriever(retriever)
    queries = [[f"{corpus.contents[i][:60]}", f"question {i}"] for i in range(40)]  # type: ignore[attr-defined]

    async def run() -> list[tuple[np.ndarray, np.ndarray]]:
        batcher = QueryBatcher(counting, max_queries=64, max_wait_s=0.05, metrics=ServiceMetrics())
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.search(q, 1 + i % 4) for i, q in enumerate(queries)))
        finally:
            await batcher.close()

    results = asyncio.run(run())
    assert sum(counting.calls) == 80 and len(counting.calls) < 40  # fewer searches than requests
    assert max(counting.calls) <= 64
    for i, (q, (scores, positions)) in enumerate(zip(queries, results, strict=True)):
        want_scores, want_positions = retriever.search(q, 1 + i % 4)
        assert positions.tolist() == want_positions.tolist()
        np.testing.assert_allclose(scores, want_scores, rtol=1e-6)


def test_request_larger_than_a_batch_is_split(bm25: tuple[Retriever, object]) -> None:
    retriever, _ = bm25
    counting = CountingRetriever(retriever)

    async def run() -> tuple[np.ndarray, np.ndarray]:
        batcher = QueryBatcher(counting, max_queries=8, max_wait_s=0.0, metrics=ServiceMetrics())
        batcher.start()
        try:
            return await batcher.search([f"query number {i}" for i in range(20)], 3)
        finally:
            await batcher.close()

    scores, positions = asyncio.run(run())
    assert positions.shape == (20, 3) and max(counting.calls) <= 8 and sum(counting.calls) == 20


def test_a_failed_batch_fails_its_requests_and_the_batcher_keeps_serving(bm25: tuple[Retriever, object]) -> None:
    retriever, _ = bm25
    counting = CountingRetriever(retriever, fail_first=True)

    async def run() -> tuple[np.ndarray, np.ndarray]:
        batcher = QueryBatcher(counting, max_queries=8, max_wait_s=0.0, metrics=ServiceMetrics())
        batcher.start()
        try:
            with pytest.raises(RuntimeError, match="index on fire"):
                await batcher.search(["first"], 3)
            return await batcher.search(["second"], 3)
        finally:
            await batcher.close()

    scores, positions = asyncio.run(run())
    assert positions.shape == (1, 3)


def test_service_caches_by_query_and_topk(bm25: tuple[Retriever, object]) -> None:
    retriever, corpus = bm25
    counting = CountingRetriever(retriever)
    metrics = ServiceMetrics()

    async def run() -> list[list[list[tuple[int, float]]]]:
        batcher = QueryBatcher(counting, max_queries=64, max_wait_s=0.0, metrics=metrics)
        batcher.start()
        service = SearchService(corpus, batcher, "bm25", cache_size=100, metrics=metrics)  # type: ignore[arg-type]
        try:
            a = await service.search(["alpha query", "beta query"], 3)
            b = await service.search(["beta query", "alpha query"], 3)  # both cached
            c = await service.search(["alpha query"], 2)  # other top-k: a miss
            return [a, b, c]
        finally:
            await batcher.close()

    a, b, c = asyncio.run(run())
    assert b == [a[1], a[0]] and c == [a[0][:2]]
    assert counting.calls == [2, 1]
    assert metrics.cache_hits._value.get() == 2 and metrics.cache_misses._value.get() == 3
