"""Coalesces concurrent searches into one encoder + index batch.

During rollout the policy sends many small concurrent requests. Encoding 128 queries at once costs far less than
128 single encodes, so requests are gathered into batches of at most ``max_queries``. The search itself runs on
one worker thread, keeping the event loop free to accept and answer requests while a batch is computed.

How long a batch waits for company matters. Clients that just got their answers usually come straight back; a batch
that starts with only the first of them splits the load into two alternating phases (a small batch, then the rest),
which costs throughput and makes every request wait for both. So a batch waits until as many queries are queued
as the previous batch served, but never longer than ``wait_fraction`` of the previous batch's search time nor
``max_wait_s``: with steady clients it fills at once, and with fewer clients the wait is a bounded fraction of work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from retriever_server.metrics import ServiceMetrics
from retriever_server.retrievers.base import Retriever

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future[tuple[np.ndarray, np.ndarray]] = field(repr=False)


class QueryBatcher:
    """Queue of pending searches drained by one background task."""

    def __init__(
        self,
        retriever: Retriever,
        max_queries: int,
        max_wait_s: float,
        metrics: ServiceMetrics,
        wait_fraction: float = 0.1,
    ) -> None:
        self.retriever = retriever
        self.max_queries = max_queries
        self.max_wait_s = max_wait_s
        self.wait_fraction = wait_fraction
        self.metrics = metrics
        self._last_size = 0  # queries in the previous batch: how many are likely to come back
        self._last_search_s = 0.0
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-search")
        self._task: asyncio.Task[None] | None = None
        self._carry: _Pending | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="query-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and positions ``(len(queries), topk)``; large requests are split into batch-sized pieces."""
        loop = asyncio.get_running_loop()
        pieces = []
        for start in range(0, len(queries), self.max_queries):
            fut: asyncio.Future[tuple[np.ndarray, np.ndarray]] = loop.create_future()
            self._queue.put_nowait(_Pending(queries[start : start + self.max_queries], topk, fut))
            pieces.append(fut)
        results = await asyncio.gather(*pieces)
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])

    async def _collect(self) -> list[_Pending]:
        if self._carry is not None:
            batch, self._carry = [self._carry], None
        else:
            batch = [await self._queue.get()]
        size = len(batch[0].queries)
        target = min(max(self._last_size, 1), self.max_queries)
        deadline = time.perf_counter() + min(self.max_wait_s, self.wait_fraction * self._last_search_s)
        while size < self.max_queries:
            if self._queue.empty():
                remaining = deadline - time.perf_counter()
                if remaining <= 0 or size >= target:
                    break
                await asyncio.sleep(min(remaining, 0.0005))
                continue
            nxt = self._queue.get_nowait()
            if size + len(nxt.queries) > self.max_queries:
                self._carry = nxt  # first in line for the next batch
                break
            batch.append(nxt)
            size += len(nxt.queries)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            batch = [p for p in batch if not p.future.cancelled()]  # client went away
            if not batch:
                continue
            queries = [q for p in batch for q in p.queries]
            topk = max(p.topk for p in batch)
            t0 = time.perf_counter()
            try:
                scores, positions = await loop.run_in_executor(self._executor, self.retriever.search, queries, topk)
            except Exception as e:  # process boundary: fail these requests, keep serving
                logger.exception("search failed for a batch of %d queries", len(queries))
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            self._last_size, self._last_search_s = len(queries), time.perf_counter() - t0
            self.metrics.batch_size.observe(self._last_size)
            self.metrics.batch_latency.observe(self._last_search_s)
            start = 0
            for p in batch:
                end = start + len(p.queries)
                if not p.future.done():
                    p.future.set_result((scores[start:end, : p.topk], positions[start:end, : p.topk]))
                start = end
