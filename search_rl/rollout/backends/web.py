"""``retriever.backend=web``: a web search API as the search engine (``providers``: Serper, Brave).

One request per query, at most ``max_concurrency`` in flight and ``requests_per_s`` started per second. A 429 waits
for the provider's ``Retry-After`` / rate-limit reset and a 5xx or transport error backs off, both within
``retry_window_s``; a 4xx, malformed answer or spent window raises ``RetrieverError`` (an observation under
``rollout.on_retriever_error=observe``). The budget (``max_calls``, ``max_cost_usd``) is reserved before each call;
when spent, ``SearchBudgetExhausted`` stops the run: it is not a ``RetrieverError``, so nothing swallows it, and it
carries the answers already paid for (the recording keeps them). The API key is read from the environment when the
backend is built and never appears in a log line, an error or a fingerprint.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
from collections.abc import Sequence
from html.parser import HTMLParser

import httpx

from search_rl.config.loading import ConfigError
from search_rl.config.search_backends import WebSearchConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.meter import CostMeter
from search_rl.rollout.backends.providers import provider
from search_rl.rollout.backends.recording import PartialResults
from search_rl.rollout.backends.retriever_client import RetrieverError, describe_failure

logger = logging.getLogger(__name__)


class SearchBudgetExhausted(PartialResults):
    """The run's search budget is spent: the run must stop (never turned into an observation)."""


class _PageText(HTMLParser):
    """Visible text of an HTML page (scripts and styles skipped)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("script", "style", "noscript")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style", "noscript") and self._skip > 0

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.parts.append(data.strip())


def page_text(html_text: str, max_chars: int) -> str:
    """The first ``max_chars`` characters of a page's visible text.

    >>> page_text("<html><script>x()</script><p>Hello</p> <p>world</p></html>", 100)
    'Hello world'
    """
    parser = _PageText()
    parser.feed(html_text)
    return " ".join(" ".join(parser.parts).split())[:max_chars]


class WebBackend:
    """A web search API behind the ``Retriever`` protocol (module docstring).

    Args:
        cfg: ``retriever.web``.
        default_topk: ``retriever.topk``.

    Raises:
        ConfigError: the key's environment variable is unset.
    """

    def __init__(self, cfg: WebSearchConfig, default_topk: int) -> None:
        key = os.environ.get(cfg.key_env, "")
        if not key:
            raise ConfigError(
                f"retriever.backend=web with provider {cfg.provider} reads its API key from ${cfg.key_env}, which is "
                "unset; export it (or point retriever.web.api_key_env at the variable that holds it)"
            )
        self.cfg, self.default_topk, self._key = cfg, default_topk, key
        self.provider = provider(cfg.provider, cfg.country, cfg.language)
        self.endpoint = cfg.endpoint or self.provider.endpoint
        self.meter = CostMeter()
        self.reserved = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self._next_start = 0.0
        self.day = dt.datetime.now(dt.UTC).date().isoformat()

    def __repr__(self) -> str:  # never the key
        return f"WebBackend(provider={self.cfg.provider}, endpoint={self.endpoint})"

    def fingerprint(self) -> BackendIdentity:
        """Provider, day (web results change), country, language and passage kind."""
        c = self.cfg
        page = c.page_chars if c.passages == "page" else None
        return BackendIdentity.of(
            "web",
            provider=c.provider,
            date=self.day,
            country=c.country,
            language=c.language,
            passages=c.passages,
            page_chars=page,
        )

    def check_reachable(self) -> None:
        """One real search (one billed call): the key works and the endpoint answers in the provider's format."""
        asyncio.run(self._probe())

    async def _probe(self) -> None:
        try:
            await self.search(["search engine"], 1)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client, self._sem, self._loop = None, None, None

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._sem is None or self._loop is not loop:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.timeout_s), follow_redirects=True)
            self._sem, self._loop = asyncio.Semaphore(self.cfg.max_concurrency), loop
        return self._client, self._sem

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***")

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """Top-``topk`` results per query.

        Raises:
            SearchBudgetExhausted: the budget is spent (``done`` holds the queries answered before).
            RetrieverError: a query failed for good.
        """
        k = topk or self.default_topk
        client, sem = self._session()
        outcomes = await asyncio.gather(*(self._one(client, sem, q, k) for q in queries), return_exceptions=True)
        done = {i: o for i, o in enumerate(outcomes) if isinstance(o, list)}
        for o in outcomes:
            if isinstance(o, SearchBudgetExhausted):
                raise SearchBudgetExhausted(str(o), done)
        for o in outcomes:
            if isinstance(o, BaseException):
                raise o
        return [done[i] for i in range(len(queries))]

    def _reserve(self) -> None:
        c, spent = self.cfg, self.reserved
        over_calls = c.max_calls is not None and spent + 1 > c.max_calls
        over_cost = c.max_cost_usd is not None and (spent + 1) * c.cost_per_call_usd > c.max_cost_usd + 1e-12
        if over_calls or over_cost:
            raise SearchBudgetExhausted(
                f"web search budget spent: {self.meter.calls} calls, ~${self.meter.cost_usd:.4f} "
                f"(retriever.web.max_calls={c.max_calls}, retriever.web.max_cost_usd={c.max_cost_usd}); the run "
                "stops here. Raise the budget, or go on from the recording with retriever.recording.mode=cache"
            )
        self.reserved += 1

    async def _pace(self) -> None:
        """Start requests no faster than ``requests_per_s``."""
        if self.cfg.requests_per_s <= 0:
            return
        now = time.monotonic()
        start = max(now, self._next_start)
        self._next_start = start + 1.0 / self.cfg.requests_per_s
        if start > now:
            await asyncio.sleep(start - now)

    async def _one(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, query: str, k: int) -> list[Passage]:
        self._reserve()
        try:
            passages = await self._call(client, sem, query, k)
        except BaseException:
            self.reserved -= 1  # not billed: the provider answered nothing usable
            raise
        self.meter.calls += 1
        self.meter.cost_usd += self.cfg.cost_per_call_usd
        if self.cfg.passages == "page":
            passages = [await self._with_page(client, sem, p) for p in passages]
        return passages

    async def _call(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, query: str, k: int) -> list[Passage]:
        start, attempt, name = time.monotonic(), 0, self.provider.name
        while True:
            wait: float | None = None
            await self._pace()
            try:
                async with sem:
                    resp = await client.send(self.provider.request(client, self.endpoint, query, k, self._key))
            except httpx.TransportError as e:
                problem, wait = describe_failure(e, self.cfg.timeout_s, "retriever.web.timeout_s"), None
            else:
                if resp.status_code == 200:
                    try:
                        return self.provider.parse(resp.json(), k)
                    except ValueError as e:  # json.JSONDecodeError is a ValueError
                        text = self._redact(resp.text[:200])
                        raise RetrieverError(f"{name} sent a malformed answer for {query!r} ({e}): {text}") from None
                problem = f"HTTP {resp.status_code}: {self._redact(resp.text[:200])}"
                if resp.status_code in (401, 403):
                    raise RetrieverError(f"{name} rejected the API key in ${self.cfg.key_env} ({problem})")
                if resp.status_code != 429 and resp.status_code < 500:
                    raise RetrieverError(f"{name} refused the query {query!r} ({problem})")
                wait = self.provider.wait_s(resp) if resp.status_code == 429 else None
            left = self.cfg.retry_window_s - (time.monotonic() - start)
            delay = wait if wait is not None else min(8.0, 0.25 * 2**attempt)
            if delay > left:
                raise RetrieverError(
                    f"{name} search for {query!r} failed after {attempt + 1} attempt(s) ({problem}); the next try "
                    f"would be in {delay:.1f} s, past retriever.web.retry_window_s={self.cfg.retry_window_s:g}"
                )
            logger.warning("%s: %s; retry %d in %.2f s", name, problem, attempt + 1, delay)
            attempt += 1
            await asyncio.sleep(delay)

    async def _with_page(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, p: Passage) -> Passage:
        """The passage with its page's text (the snippet stays when the page cannot be fetched)."""
        try:
            async with sem:
                resp = await client.get(p.id)
            if resp.status_code == 200 and "html" in resp.headers.get("content-type", "html"):
                text = page_text(resp.text, self.cfg.page_chars)
                if text:
                    return Passage(p.id, p.title, text, p.score)
        except httpx.HTTPError as e:
            logger.info("page %s not fetched (%s); keeping the snippet", p.id, type(e).__name__)
        return p
