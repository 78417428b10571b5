"""Search service: the LRU result cache in front of the query batcher, and where the documents of hits come from."""

from __future__ import annotations

from typing import Protocol

from cachetools import LRUCache

from retriever_server.api.batching import QueryBatcher
from retriever_server.api.metrics import ServiceMetrics
from retriever_server.index.corpus import Corpus

Hit = tuple[int, float]
"""(corpus position, score)."""
Document = dict[str, str]
"""``{"id", "contents"}``, as Search-R1 returns a corpus row."""


class Documents(Protocol):
    """The documents at ranked positions: the local corpus, or the shards of a Ray Serve index."""

    def __len__(self) -> int: ...

    async def rows(self, hits: list[list[Hit]]) -> list[list[Document]]:
        """The document of every hit, in the shape of ``hits``."""
        ...


class CorpusDocuments:
    """Documents read from a corpus in this process (a memory-mapped store: a lookup is a slice)."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def __len__(self) -> int:
        return len(self.corpus)

    async def rows(self, hits: list[list[Hit]]) -> list[list[Document]]:
        doc = self.corpus.document
        return [[doc(p) for p, _ in row] for row in hits]


class SearchService:
    """Answers lists of queries with ranked (position, score) hits, caching recent (query, top-k, method) results."""

    def __init__(
        self, documents: Documents, batcher: QueryBatcher, method: str, cache_size: int, metrics: ServiceMetrics
    ) -> None:
        self.documents = documents
        self.batcher = batcher
        self.method = method
        self.metrics = metrics
        self._cache: LRUCache[tuple[str, int, str], list[Hit]] | None = LRUCache(cache_size) if cache_size else None

    async def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Ranked hits per query, best first; slots without a document are left out."""
        results: list[list[Hit] | None] = [None] * len(queries)
        missing: list[int] = []
        for i, q in enumerate(queries):
            cached = self._cache.get((q, topk, self.method)) if self._cache is not None else None
            if cached is None:
                missing.append(i)
            else:
                results[i] = cached
        self.metrics.cache_hits.inc(len(queries) - len(missing))
        self.metrics.cache_misses.inc(len(missing))
        if missing:
            scores, positions = await self.batcher.search([queries[i] for i in missing], topk)
            for row, i in enumerate(missing):
                hits = [(int(p), float(s)) for p, s in zip(positions[row], scores[row], strict=True) if p >= 0]
                results[i] = hits
                if self._cache is not None:
                    self._cache[(queries[i], topk, self.method)] = hits
        return [r if r is not None else [] for r in results]
