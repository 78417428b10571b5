"""Schedules searches fairly across requests and coalesces them into encoder + index batches.

During rollout the policy sends many small concurrent requests. Encoding 128 queries at once costs far less than
128 single encodes, so the queries of concurrent requests are gathered into one batch. The search runs on one
worker thread, keeping the event loop free to accept and answer requests while a batch is computed.

**Turns.** Waiting requests form a ring, served in turns (deficit round robin). A turn is at most half a batch:
``max_queries / 2`` queries and ``max_chars / 2`` characters, at least one query. A batch takes turns from the front
of the ring until it holds ``max_queries`` queries or ``max_chars`` characters; a request with queries left after its
turn goes to the back. Requests no bigger than a turn are therefore served first come, first served, while a request
of 1,024 long queries no longer holds the worker until it is done: a 1-query request sent after it waits for one
turn of each request ahead of it. The character cap bounds how long one batch runs.

**Waiting for company.** Clients that just got their answers usually come straight back; a batch that starts with
only the first of them splits the load into two alternating phases (a small batch, then the rest), which costs
throughput and makes every request wait for both. So a batch waits until as many queries are queued as the previous
batch served, but never longer than ``wait_fraction`` of the previous batch's search time nor ``max_wait_s``.

**Load shedding.** ``work_model.WorkModel`` predicts search time from batches at least half full (a queue drains in
full batches; small ones cost more per query). A request's wait is the rest of the batch in flight plus the turns
the requests ahead of it get before it is done. A new request whose wait is above ``max_queue_wait_s`` is refused at
once with ``Overloaded`` (the route answers 503 with ``Retry-After``) instead of queueing past the point where its
client gives up; after every batch, requests not started yet are checked again, which sheds the excess of a burst
that arrived before any batch had been timed.

**Failures.** When a batch raises, each request in it is searched again on its own, so only a request whose own
queries make the backend fail gets an error (``SearchFailed``); the others get their answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from retriever_server.api.metrics import ServiceMetrics
from retriever_server.api.work_model import WorkModel
from retriever_server.retrievers.base import Retriever
from retriever_server.settings import Settings

logger = logging.getLogger(__name__)

SearchResult = tuple[np.ndarray, np.ndarray]
"""(scores, positions), both ``(queries, topk)``; position -1 marks an empty slot."""


class Overloaded(RuntimeError):
    """The estimated wait is above the limit; ``retry_after_s`` is when the queue should have drained enough."""

    def __init__(self, wait_s: float, limit_s: float) -> None:
        self.wait_s = wait_s
        self.retry_after_s = max(1, math.ceil(wait_s - limit_s))
        super().__init__(
            f"retriever overloaded: estimated wait {wait_s:.1f}s is above RETRIEVER_MAX_QUEUE_WAIT_S={limit_s:g}s; "
            f"retry in {self.retry_after_s}s"
        )


class SearchFailed(RuntimeError):
    """The backend raised on this request's queries, searched without any other request's."""


@dataclass(eq=False)
class _Request:
    """One caller's queries, answered piece by piece as batches complete."""

    queries: list[str]
    topk: int
    future: asyncio.Future[SearchResult] = field(repr=False)
    scores: np.ndarray = field(repr=False)  # (Q, topk)
    positions: np.ndarray = field(repr=False)  # (Q, topk)
    chars_left: int
    """Characters of the queries not yet in a batch."""
    scheduled: int = 0
    """``queries[:scheduled]`` have been put in a batch."""
    answered: int = 0
    turn_queries: int = 0
    """What is left of the current turn (0: the next one starts when this request is served again)."""
    turn_chars: int = 0

    @property
    def queries_left(self) -> int:
        return len(self.queries) - self.scheduled


@dataclass
class _Slice:
    request: _Request
    start: int
    stop: int


class QueryBatcher:
    """Ring of pending searches drained by one background task (see the module docstring)."""

    def __init__(
        self,
        retriever: Retriever,
        max_queries: int,
        max_wait_s: float,
        metrics: ServiceMetrics,
        wait_fraction: float = Settings.model_fields["batch_wait_fraction"].default,
        max_chars: int = sys.maxsize,
        max_queue_wait_s: float = math.inf,
    ) -> None:
        self.retriever = retriever
        self.max_queries = max_queries
        self.max_chars = max_chars
        self.turn_queries = max(1, max_queries // 2)
        self.turn_chars = max(1, max_chars // 2)
        self.max_wait_s = max_wait_s
        self.wait_fraction = wait_fraction
        self.max_queue_wait_s = max_queue_wait_s
        self.metrics = metrics
        self.model = WorkModel()
        self._last_size = 0  # queries in the previous batch: how many are likely to come back
        self._last_search_s = 0.0
        self._ring: deque[_Request] = deque()  # requests with queries not yet in a batch, front served next
        self._has_work = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-search")
        self._task: asyncio.Task[None] | None = None
        self._inflight_s = 0.0  # predicted seconds of the batch being searched, and when it started
        self._inflight_t0 = 0.0
        self._refused_s = 0.0  # predicted work of recently refused requests, not yet drained (see _refuse)
        self._refused_t = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="query-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for r in self._ring:
            r.future.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def search(self, queries: list[str], topk: int) -> SearchResult:
        """Scores and positions ``(len(queries), topk)``.

        Raises:
            Overloaded: the estimated wait is above ``max_queue_wait_s``, now or when checked again after a batch.
            SearchFailed: the backend raised on these queries.
        """
        request = _Request(
            queries,
            topk,
            asyncio.get_running_loop().create_future(),
            np.full((len(queries), topk), -np.inf, dtype=np.float32),
            np.full((len(queries), topk), -1, dtype=np.int64),
            chars_left=sum(len(q) for q in queries),
        )
        if not queries:
            return request.scores, request.positions
        wait_s = self._wait_s(request, list(self._ring)) + self._inflight_left_s()
        self.metrics.estimated_wait.set(wait_s)
        if wait_s > self.max_queue_wait_s:
            raise self._refuse(request, wait_s)
        self._ring.append(request)
        self._has_work.set()
        return await request.future  # cancelling the caller cancels the future: the batcher then drops the request

    # --- the wait estimate -------------------------------------------------------------------------------------

    def _turn_size(self, r: _Request) -> int:
        """Queries ``r`` gets per turn, from the mean length of its queries left."""
        mean_chars = max(1.0, r.chars_left / r.queries_left)
        return max(1, min(self.turn_queries, math.ceil(self.turn_chars / mean_chars)))

    def _turns_s(self, r: _Request, turns: int) -> float:
        """Predicted seconds of ``r``'s next ``turns`` turns."""
        n = min(r.queries_left, turns * self._turn_size(r))
        return self.model.seconds(n, n * r.chars_left / r.queries_left) or 0.0

    def _wait_s(self, r: _Request, ahead: list[_Request], behind: list[_Request] | None = None) -> float:
        """Seconds ``r`` waits for the turns the others get before its last one (0 until a batch has been timed)."""
        if self.model.batches == 0:
            return 0.0
        turns = math.ceil(r.queries_left / self._turn_size(r))
        wait = sum(self._turns_s(j, turns) for j in ahead if not j.future.done())
        if turns > 1 and behind:
            wait += sum(self._turns_s(j, turns - 1) for j in behind if not j.future.done())
        return wait

    def _refuse(self, r: _Request, wait_s: float) -> Overloaded:
        """The error for a refused request. Its ``Retry-After`` counts the requests refused before it as if they were
        still in line, so that refused clients that come back as told come back one after another, not all at once."""
        now = time.perf_counter()
        self._refused_s = max(0.0, self._refused_s - (now - self._refused_t))  # the line moves on in real time
        self._refused_t = now
        error = Overloaded(wait_s + self._refused_s, self.max_queue_wait_s)
        self._refused_s += self._turns_s(r, math.ceil(r.queries_left / self._turn_size(r)))
        self.metrics.shed.inc()
        return error

    def _inflight_left_s(self) -> float:
        return max(0.0, self._inflight_s - (time.perf_counter() - self._inflight_t0)) if self._inflight_s else 0.0

    def _shed_queued(self) -> None:
        """After a batch: refuse requests not started yet whose wait, with what is now known, is over the limit."""
        if self.model.batches == 0 or math.isinf(self.max_queue_wait_s):
            return
        ring = [r for r in self._ring if not r.future.done()]
        ahead_s = 0.0  # one turn of every kept request ahead: the wait of a request that needs a single turn
        for i, r in enumerate(ring):
            if r.scheduled == 0:
                single = r.queries_left <= self._turn_size(r)
                wait = ahead_s if single else self._wait_s(r, ring[:i], ring[i + 1 :])
                if wait > self.max_queue_wait_s:
                    r.future.set_exception(self._refuse(r, wait))
                    continue
            ahead_s += self._turns_s(r, 1)
        self._ring = deque(r for r in self._ring if not r.future.done())

    # --- scheduling ------------------------------------------------------------------------------------------

    def _unscheduled_queries(self) -> int:
        self._ring = deque(r for r in self._ring if not r.future.done())  # drop callers that went away
        return sum(r.queries_left for r in self._ring)

    async def _next_batch(self) -> list[_Slice]:
        while self._unscheduled_queries() == 0:
            self._has_work.clear()
            await self._has_work.wait()
        target = min(max(self._last_size, 1), self.max_queries)
        deadline = time.perf_counter() + min(self.max_wait_s, self.wait_fraction * self._last_search_s)
        while self._unscheduled_queries() < target and time.perf_counter() < deadline:
            await asyncio.sleep(min(deadline - time.perf_counter(), 0.0005))
        return self._take()

    def _take(self) -> list[_Slice]:
        """Turns from the front of the ring until the batch is full (see the module docstring)."""
        batch: list[_Slice] = []
        size = chars = 0
        while self._ring:
            r = self._ring[0]
            if r.turn_queries == 0:
                r.turn_queries, r.turn_chars = self.turn_queries, self.turn_chars
            start, full = r.scheduled, False
            while r.queries_left and r.turn_queries > 0 and r.turn_chars > 0:
                n = len(r.queries[r.scheduled])
                if size and (size >= self.max_queries or chars + n > self.max_chars):
                    full = True
                    break
                r.scheduled += 1
                r.chars_left -= n
                r.turn_queries -= 1
                r.turn_chars -= n
                size, chars = size + 1, chars + n
            if r.scheduled > start:
                if batch and batch[-1].request is r:
                    batch[-1].stop = r.scheduled
                else:
                    batch.append(_Slice(r, start, r.scheduled))
            if full:
                break  # r keeps the rest of its turn and stays in front
            self._ring.popleft()
            r.turn_queries = 0
            if r.queries_left:
                self._ring.append(r)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            if batch:
                await self._search_batch(batch)
                self._shed_queued()

    async def _search(self, queries: list[str], topk: int) -> SearchResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.retriever.search, queries, topk)

    async def _search_batch(self, batch: list[_Slice]) -> None:
        queries = [q for s in batch for q in s.request.queries[s.start : s.stop]]
        chars = sum(len(q) for q in queries)
        topk = max(s.request.topk for s in batch)
        self._inflight_s, self._inflight_t0 = self.model.seconds(len(queries), chars) or 0.0, time.perf_counter()
        try:
            scores, positions = await self._search(queries, topk)
        except Exception as e:  # process boundary: find the request that caused it, keep serving the rest
            logger.warning("search failed for a batch of %d queries from %d requests (%s)", len(queries), len(batch), e)
            self._inflight_s = 0.0
            await self._isolate(batch, e)
            return
        elapsed = time.perf_counter() - self._inflight_t0
        self._inflight_s = 0.0
        if 2 * len(queries) >= self.max_queries or 2 * chars >= self.max_chars:
            self.model.add(len(queries), chars, elapsed)
        self._last_size, self._last_search_s = len(queries), elapsed
        logger.debug("searched %d queries (%d chars) of %d requests in %.3fs", len(queries), chars, len(batch), elapsed)
        self.metrics.batch_size.observe(len(queries))
        self.metrics.batch_latency.observe(elapsed)
        row = 0
        for s in batch:
            n = s.stop - s.start
            self._deliver(s, scores[row : row + n], positions[row : row + n])
            row += n

    async def _isolate(self, batch: list[_Slice], error: Exception) -> None:
        """Search each request's part of a failed batch on its own; fail only the parts that fail alone."""
        for s in batch:
            r = s.request
            if r.future.done():
                continue
            if len(batch) > 1:
                try:
                    scores, positions = await self._search(r.queries[s.start : s.stop], r.topk)
                except Exception as e:  # process boundary: this request's own queries fail
                    error = e
                else:
                    self._deliver(s, scores, positions)
                    continue
            logger.error(
                "search failed for a request of %d queries: %s: %s", len(r.queries), type(error).__name__, error
            )
            self.metrics.search_failures.inc()
            failure = SearchFailed(
                f"the search backend failed on this request's queries ({type(error).__name__}: {error})"
            )
            failure.__cause__ = error
            r.future.set_exception(failure)

    @staticmethod
    def _deliver(s: _Slice, scores: np.ndarray, positions: np.ndarray) -> None:
        r = s.request
        if r.future.done():
            return
        r.scores[s.start : s.stop] = scores[:, : r.topk]
        r.positions[s.start : s.stop] = positions[:, : r.topk]
        r.answered += s.stop - s.start
        if r.answered == len(r.queries):
            r.future.set_result((r.scores, r.positions))
