"""HTTP client of the retriever service: ``POST {url}/retrieve`` with timeouts, retries, chunking and failover; also
``POST {url}/documents`` (whole articles, the ``open`` tool) through the same retries.

One shared ``httpx.AsyncClient`` per event loop; large query batches are split into chunks sent concurrently under a
semaphore; each chunk starts at the next URL (round-robin) and a retry moves to the following URL (failover).
Connection errors, timeouts, 429 and 5xx are retried with exponential backoff (or after the server's ``Retry-After``
when it asks for longer: an overloaded retriever's 503 says when to come back) for ``retry_window_s`` seconds (long
enough to outlast a retriever restart); other 4xx and malformed answers are not (retrying cannot fix them). Every
final failure raises ``RetrieverError`` naming the URL and how to start a server there; no ``(result, error)``
tuples. ``check_reachable`` runs before training: ``GET /health`` and one real ``POST /retrieve`` per URL.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

from retriever_server.passages import split_contents
from search_rl.config import RetrieverClientConfig
from search_rl.datatypes import Passage

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
T = TypeVar("T")


def retry_after_s(header: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header in its delay form (``"3"``); None when absent or an HTTP date.

    >>> retry_after_s("3"), retry_after_s(None), retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT")
    (3.0, None, None)
    """
    if header is None:
        return None
    try:
        value = float(header.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


PROBE_QUERY = "retriever start-up check"
"""The query ``check_reachable`` sends to prove that ``POST /retrieve`` answers."""


def start_hint(url: str) -> str:
    """How to start a retriever that ``url`` reaches (quoted in every error about an unreachable retriever).

    >>> "--host 10.0.0.5 --port 8123`" in start_hint("http://10.0.0.5:8123")
    True
    """
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host = parsed.host if parsed.host not in ("localhost", "") else "127.0.0.1"
    path = parsed.path.rstrip("/")
    where = f"; the server answers at its root, not under {path}" if path else ""
    return (
        f"start it with `RETRIEVER_METHOD=bm25 python -m uvicorn retriever_server.app:app --host {host} --port {port}` "
        f"(or fix retriever.url={url}{where})"
    )


def describe_failure(error: httpx.TransportError, timeout_s: float, setting: str = "retriever.timeout_s") -> str:
    """One line for a transport error (httpx's timeouts carry no text of their own); ``setting`` names the timeout."""
    if isinstance(error, httpx.TimeoutException):
        return f"{type(error).__name__}: no answer within {timeout_s:g} s ({setting}); hung or overloaded?"
    return f"{type(error).__name__}: {str(error) or 'no detail'}"


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
            RetrieverError: when a chunk still fails at the end of ``cfg.retry_window_s``, or an answer is malformed.
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

    async def documents(self, ids: Sequence[str], max_chars: int) -> list[Passage | None]:
        """The whole article of each document id (``POST {url}/documents``; the ``open`` tool), None for an id the
        corpus does not have; retried and failed over like a search.

        Raises:
            RetrieverError: the request still fails at the end of ``cfg.retry_window_s``, or the answer is malformed.
        """
        if not ids:
            return []
        client, sem = self._session()
        payload = {"ids": list(ids), "max_chars": max_chars}
        return await self._post(client, sem, "documents", payload, lambda r, url: _parse_articles(r, len(ids), url))

    async def _post_chunk(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, queries: list[str], topk: int
    ) -> list[list[Passage]]:
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        return await self._post(client, sem, "retrieve", payload, lambda r, url: _parse_response(r, len(queries), url))

    async def _post(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        path: str,
        payload: dict[str, Any],
        parse: Callable[[httpx.Response, str], T],
    ) -> T:
        """POST ``payload`` to ``{url}/{path}`` with the retries and failover of the module docstring."""
        first = next(self._rr)
        start = time.monotonic()
        attempt, last_problem = 0, ""
        while True:
            server_wait: float | None = None
            url = self.urls[(first + attempt) % len(self.urls)]
            self.requests_by_url[url] += 1
            try:
                async with sem:
                    resp = await client.post(f"{url}/{path}", json=payload)
            except httpx.TransportError as e:
                last_problem = describe_failure(e, self.cfg.timeout_s)
            else:
                if resp.status_code < 400:
                    return parse(resp, url)
                if resp.status_code not in _RETRYABLE_STATUS:
                    self.failures += 1
                    raise RetrieverError(
                        f"retriever {url}/{path} answered HTTP {resp.status_code}: {resp.text[:300]}", url
                    )
                last_problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
                server_wait = retry_after_s(resp.headers.get("retry-after"))
            delay = self._retry_delay(attempt, time.monotonic() - start, server_wait)
            if delay is None:
                break
            logger.warning("retriever %s failed (%s); retry %d in %.1fs", url, last_problem, attempt + 1, delay)
            self.retries += 1
            attempt += 1
            await asyncio.sleep(delay)
        self.failures += 1
        raise RetrieverError(
            f"retriever request failed after {attempt + 1} attempt(s) in {time.monotonic() - start:.1f} s "
            f"(retriever.retry_window_s={self.cfg.retry_window_s:g}), last at {url}/{path} ({last_problem}). "
            f"Is the retriever running? {start_hint(url)}",
            url,
        )

    def _retry_delay(self, attempt: int, elapsed_s: float, server_wait_s: float | None = None) -> float | None:
        """Wait before retry ``attempt + 1``: exponential backoff, or the server's ``Retry-After`` when it asks for
        longer (an overloaded retriever says when its queue will have drained), cut to what is left of the retry
        window; None when the window (or ``max_retries``) is spent."""
        cfg = self.cfg
        left = cfg.retry_window_s - elapsed_s
        if left <= 0 or (cfg.max_retries is not None and attempt >= cfg.max_retries):
            return None
        backoff = min(cfg.backoff_max_s, cfg.backoff_s * 2**attempt)
        return min(max(backoff, server_wait_s or 0.0), left)

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        """Fail fast before a run: every URL must be ready (``GET /health``) and answer one real ``POST /retrieve``.

        The search request is what counts: a wrong path in ``retriever.url`` or another service on the port answers
        ``/health`` with 404 (or even 200) but cannot search.

        Raises:
            RetrieverError: naming the first URL that is down, not ready or cannot search, and how to start one.
        """
        payload = {"queries": [PROBE_QUERY], "topk": 1, "return_scores": True}
        with httpx.Client(timeout=timeout_s, trust_env=self.cfg.trust_env) as client:
            for url in self.urls:
                try:
                    health = client.get(f"{url}/health")
                    if health.status_code not in (200, 404):  # 404: no /health route; the search below decides
                        raise RetrieverError(
                            f"retriever at {url} is not ready: GET {url}/health answered {health.status_code} "
                            f"{health.text[:200]}",
                            url,
                        )
                    resp = client.post(f"{url}/retrieve", json=payload)
                except httpx.TransportError as e:
                    raise RetrieverError(
                        f"retriever at {url} is not reachable ({describe_failure(e, timeout_s, 'start-up check')}). "
                        f"{start_hint(url)}",
                        url,
                    ) from e
                if resp.status_code != 200:
                    raise RetrieverError(
                        f"retriever at {url} cannot search: POST {url}/retrieve answered HTTP {resp.status_code} "
                        f"{resp.text[:200]}. Is retriever.url right? {start_hint(url)}",
                        url,
                    )
                _parse_response(resp, 1, url)


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


def _parse_articles(resp: httpx.Response, n_ids: int, url: str) -> list[Passage | None]:
    """Validate and convert ``{"result": [{"id", "title", "text", ...} | null, ...]}``."""
    try:
        result = resp.json()["result"]
        if not isinstance(result, list) or len(result) != n_ids:
            raise ValueError(f"expected {n_ids} articles, got {len(result) if isinstance(result, list) else result!r}")
        return [None if a is None else Passage(str(a["id"]), str(a["title"]), str(a["text"])) for a in result]
    except (ValueError, KeyError, TypeError) as e:
        raise RetrieverError(f"retriever {url}/documents sent a malformed answer ({e}): {resp.text[:300]}", url) from e
