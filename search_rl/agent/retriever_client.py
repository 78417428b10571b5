"""HTTP client of the retriever service: ``POST {url}/retrieve`` with timeouts, retries, chunking and failover.

One shared ``httpx.AsyncClient`` per event loop; large query batches are split into chunks sent concurrently under a
semaphore; each chunk starts at the next URL (round-robin) and a retry moves to the following URL (failover).
Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; other 4xx and malformed answers are
not (retrying cannot fix them). Every final failure raises ``RetrieverError``; no ``(result, error)`` tuples.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from retriever_server.corpus import split_contents
from search_rl.config import START_RETRIEVER_HINT, RetrieverClientConfig
from search_rl.datatypes import Passage

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class RetrieverError(RuntimeError):
    """The retriever could not answer (after retries), or answered something unusable. ``url`` is the last tried."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


def parse_document(doc: dict[str, Any], score: float | None = None) -> Passage:
    """A ``Passage`` from one result document: ``contents`` is ``"\\"Title\\"\\ntext"`` (wiki-18 layout).

    >>> parse_document({"id": "3", "contents": '"Paris"\\nParis is the capital.'})
    Passage(id='3', title='Paris', text='Paris is the capital.', score=None)
    """
    if "contents" in doc:
        title, text = split_contents(str(doc["contents"]))
    else:  # a server that sends title and text apart
        title, text = str(doc.get("title", "")).strip(), str(doc.get("text", "")).strip()
    return Passage(id=str(doc.get("id", "")), title=title, text=text, score=score)


class RetrieverClient:
    """Async client of one or several retriever replicas.

    Args:
        cfg: URLs, top-k, timeout, retry and batching settings.
        transport: optional httpx transport (tests inject failures that a real server cannot be made to produce).

    Attributes:
        requests_by_url: HTTP requests sent per base URL (for metrics and round-robin checks).
        retries: retries performed; failures: chunks that failed for good.
    """

    def __init__(self, cfg: RetrieverClientConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.cfg = cfg
        self.urls = cfg.urls
        self._transport = transport
        self._rr = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self.requests_by_url: Counter[str] = Counter()
        self.retries = 0
        self.failures = 0
        self.wait_s = 0.0

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """Client and semaphore of the running loop (rebuilt under a new loop, e.g. a later ``asyncio.run``)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._sem is None or self._loop is not loop:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.cfg.timeout_s),
                limits=httpx.Limits(max_connections=self.cfg.max_concurrency),
                transport=self._transport,
                trust_env=self.cfg.trust_env,
            )
            self._sem = asyncio.Semaphore(self.cfg.max_concurrency)
            self._loop = loop
        return self._client, self._sem

    async def aclose(self) -> None:
        """Close the HTTP client of the current loop."""
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client, self._sem, self._loop = None, None, None

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """Top-``topk`` passages for each query, in query order.

        Raises:
            RetrieverError: when a chunk still fails after ``cfg.max_retries`` retries, or an answer is malformed.
        """
        if not queries:
            return []
        k = topk or self.cfg.topk
        n = self.cfg.max_queries_per_request
        chunks = [list(queries[i : i + n]) for i in range(0, len(queries), n)]
        client, sem = self._session()
        start = time.perf_counter()
        tasks = [asyncio.ensure_future(self._post_chunk(client, sem, chunk, k)) for chunk in chunks]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        finally:
            self.wait_s += time.perf_counter() - start
        return [row for part in parts for row in part]

    async def _post_chunk(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, queries: list[str], topk: int
    ) -> list[list[Passage]]:
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        first = next(self._rr)
        attempts = 1 + self.cfg.max_retries
        last_problem, url = "", self.urls[first % len(self.urls)]
        for attempt in range(attempts):
            url = self.urls[(first + attempt) % len(self.urls)]
            self.requests_by_url[url] += 1
            try:
                async with sem:
                    resp = await client.post(f"{url}/retrieve", json=payload)
            except httpx.TransportError as e:
                last_problem = f"{type(e).__name__}: {e or 'no detail'}"
            else:
                if resp.status_code < 400:
                    return _parse_response(resp, len(queries), url)
                if resp.status_code not in _RETRYABLE_STATUS:
                    self.failures += 1
                    raise RetrieverError(
                        f"retriever {url}/retrieve answered HTTP {resp.status_code}: {resp.text[:300]}", url
                    )
                last_problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
            if attempt + 1 < attempts:
                delay = min(self.cfg.backoff_max_s, self.cfg.backoff_s * 2**attempt)
                logger.warning(
                    "retriever %s failed (%s); retry %d/%d in %.1fs",
                    url,
                    last_problem,
                    attempt + 1,
                    attempts - 1,
                    delay,
                )
                self.retries += 1
                await asyncio.sleep(delay)
        self.failures += 1
        raise RetrieverError(
            f"retriever request failed after {attempts} attempt(s), last at {url}/retrieve ({last_problem}). "
            f"Is the retriever running? {START_RETRIEVER_HINT}",
            url,
        )

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail fast before a run: every URL must answer ``GET /health`` (404 = an older server, accepted).

        Raises:
            RetrieverError: naming the first URL that is down or not ready, and how to start the retriever.
        """
        with httpx.Client(timeout=timeout_s, trust_env=self.cfg.trust_env) as client:
            for url in self.urls:
                try:
                    resp = client.get(f"{url}/health")
                except httpx.TransportError as e:
                    raise RetrieverError(
                        f"retriever at {url} is not reachable ({e}). {START_RETRIEVER_HINT}", url
                    ) from e
                if resp.status_code == 404:
                    logger.warning("retriever at %s has no /health route; assuming it is ready", url)
                elif resp.status_code != 200:
                    raise RetrieverError(
                        f"retriever at {url} is not ready: GET /health answered {resp.status_code} {resp.text[:200]}",
                        url,
                    )


def _parse_response(resp: httpx.Response, n_queries: int, url: str) -> list[list[Passage]]:
    """Validate and convert ``{"result": [[{"document": {...}, "score": s}, ...], ...]}``."""
    try:
        result = resp.json()["result"]
        if not isinstance(result, list) or len(result) != n_queries:
            got = len(result) if isinstance(result, list) else type(result).__name__
            raise ValueError(f"expected {n_queries} result lists, got {got}")
        return [
            [
                parse_document(hit["document"], hit.get("score")) if "document" in hit else parse_document(hit)
                for hit in hits
            ]
            for hits in result
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RetrieverError(f"retriever {url}/retrieve sent a malformed answer ({e}): {resp.text[:300]}", url) from e
