"""The query batcher and the search service over a real BM25 index:
``python -m pytest tests/retriever_server/api/test_batching.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from numerics import assert_same_top_k, reorder_tol

from retriever_server.api.batching import Overloaded, QueryBatcher, SearchFailed
from retriever_server.api.metrics import ServiceMetrics
from retriever_server.api.service import SearchService
from retriever_server.index.build import load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.retrievers.base import Retriever
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
        # a BM25 score sums a term per query word (at most one per character), batched or alone in another order
        tol = reorder_tol(max(len(text) for text in q)) * float(np.abs(want_scores).max())
        assert_same_top_k(positions, scores, want_positions, want_scores, tol)


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


class RecordingRetriever:
    """A real retriever that records every batch's queries and can be told which query makes it raise (a backend
    failure we cannot otherwise provoke) and how long each query takes (a fixed pace, so timing is predictable on a
    shared machine)."""

    name = "recording"

    def __init__(self, inner: Retriever, poison: str | None = None, s_per_query: float = 0.0) -> None:
        self.inner = inner
        self.poison = poison
        self.s_per_query = s_per_query
        self.batches: list[list[str]] = []
        self.started = threading.Event()

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        self.batches.append(list(queries))
        self.started.set()
        t0 = time.perf_counter()
        if self.poison in queries:
            raise ValueError(f"cannot encode {self.poison!r}")
        out = self.inner.search(queries, topk)
        time.sleep(max(0.0, self.s_per_query * len(queries) - (time.perf_counter() - t0)))
        return out


def test_a_poison_query_fails_only_its_own_request(bm25: tuple[Retriever, object]) -> None:
    """Issue 16: one bad query failed 27-30 of 40 concurrent requests that shared its batch."""
    retriever, _ = bm25
    recording = RecordingRetriever(retriever, poison="POISON")
    valid = [[f"question {i} about history", f"river {i}"] for i in range(40)]

    async def run() -> list[object]:
        batcher = QueryBatcher(recording, max_queries=256, max_wait_s=0.05, metrics=ServiceMetrics())
        batcher.start()
        try:
            calls = [batcher.search(q, 3) for q in valid[:20]] + [batcher.search(["ok", "POISON"], 3)]
            calls += [batcher.search(q, 3) for q in valid[20:]]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await batcher.close()

    results = asyncio.run(run())
    assert any("POISON" in b and len(b) > 2 for b in recording.batches)  # it did share a batch with the others
    poisoned = results.pop(20)
    assert isinstance(poisoned, SearchFailed) and "cannot encode 'POISON'" in str(poisoned)
    for q, got in zip(valid, results, strict=True):
        assert not isinstance(got, BaseException), got
        assert got[1].tolist() == retriever.search(q, 3)[1].tolist()


def test_a_small_request_does_not_wait_for_a_big_one(bm25: tuple[Retriever, object]) -> None:
    """Issue 16: a 1-query request sent behind a maximum-size one waited for all of it (94.5 s)."""
    retriever, _ = bm25
    recording = RecordingRetriever(retriever, s_per_query=0.002)
    big = [f"long question number {i} about rivers and cities" for i in range(400)]
    order: list[str] = []

    async def run() -> None:
        batcher = QueryBatcher(recording, max_queries=32, max_wait_s=0.0, metrics=ServiceMetrics())
        batcher.start()

        async def tagged(name: str, queries: list[str]) -> None:
            await batcher.search(queries, 3)
            order.append(name)

        try:
            big_task = asyncio.create_task(tagged("big", big))
            await asyncio.to_thread(recording.started.wait, 10)  # the big request is being searched
            await asyncio.gather(tagged("small", ["who painted the mona lisa"]), big_task)
        finally:
            await batcher.close()

    asyncio.run(run())
    assert order == ["small", "big"]
    small_batch = next(i for i, b in enumerate(recording.batches) if "who painted the mona lisa" in b)
    assert small_batch <= 2  # the batch in flight, then at most one more turn of the big request
    assert sum(len(b) for b in recording.batches) == 401 and max(len(b) for b in recording.batches) <= 32


def test_batches_respect_the_character_cap(bm25: tuple[Retriever, object]) -> None:
    retriever, _ = bm25
    recording = RecordingRetriever(retriever)
    queries = [("word " * (20 + 37 * i % 300)).strip() for i in range(60)]

    async def run() -> tuple[np.ndarray, np.ndarray]:
        batcher = QueryBatcher(recording, max_queries=64, max_wait_s=0.0, metrics=ServiceMetrics(), max_chars=3000)
        batcher.start()
        try:
            return await batcher.search(queries, 2)
        finally:
            await batcher.close()

    scores, positions = asyncio.run(run())
    assert positions.tolist() == retriever.search(queries, 2)[1].tolist()
    assert all(len(b) == 1 or sum(map(len, b)) <= 3000 for b in recording.batches)
    assert len(recording.batches) > 1


def test_overload_is_refused_at_once_and_admitted_requests_finish_in_time(bm25: tuple[Retriever, object]) -> None:
    """Requests whose estimated wait is over the limit get ``Overloaded`` (503) instead of queueing for ever;
    the excess of a burst that arrives before any batch was timed is refused after the first batch."""
    retriever, _ = bm25
    paced = RecordingRetriever(retriever, s_per_query=0.004)  # 16 queries: 64 ms
    limit_s = 0.5
    outcomes: list[tuple[str, float]] = []

    async def run() -> None:
        batcher = QueryBatcher(paced, 16, 0.0, ServiceMetrics(), max_queue_wait_s=limit_s)
        batcher.start()
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            try:
                await batcher.search([f"query {i} {j}" for j in range(16)], 3)
                outcomes.append(("ok", time.perf_counter() - t0))
            except Overloaded as e:
                assert e.retry_after_s >= 1 and "RETRIEVER_MAX_QUEUE_WAIT_S" in str(e)
                outcomes.append(("shed", time.perf_counter() - t0))

        try:
            await asyncio.gather(*(one(i) for i in range(40)))  # ~2.6 s of work arrives before anything is timed
            first = len(outcomes)
            await asyncio.gather(*(one(i) for i in range(40, 80)))  # now the wait is known on arrival
            assert [k for k, _ in outcomes[first:]].count("shed") >= 25
            assert max(t for k, t in outcomes[first:] if k == "shed") < min(t for k, t in outcomes[first:] if k == "ok")
        finally:
            await batcher.close()

    asyncio.run(run())
    ok = [t for k, t in outcomes if k == "ok"]
    shed = [t for k, t in outcomes if k == "shed"]
    assert len(shed) >= 40 and len(ok) >= 8
    assert len(ok) <= 2 * (limit_s / 0.064 + 2)  # about limit / batch time per burst were let in


def test_a_request_whose_caller_went_away_is_dropped(bm25: tuple[Retriever, object]) -> None:
    retriever, _ = bm25
    recording = RecordingRetriever(retriever, s_per_query=0.002)

    async def run() -> None:
        batcher = QueryBatcher(recording, max_queries=16, max_wait_s=0.0, metrics=ServiceMetrics())
        batcher.start()
        try:
            task = asyncio.create_task(batcher.search([f"query {i}" for i in range(400)], 3))
            await asyncio.to_thread(recording.started.wait, 10)
            task.cancel()
            await asyncio.sleep(0.3)
        finally:
            await batcher.close()

    asyncio.run(run())
    assert sum(len(b) for b in recording.batches) <= 48  # the batch in flight, perhaps the next; not all 400
