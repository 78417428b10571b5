"""Search service: the LRU result cache in front of the query batcher, and where the documents of hits come from."""

from __future__ import annotations

from typing import Protocol

from cachetools import LRUCache

from retriever_server.api.batching import QueryBatcher
from retriever_server.api.metrics import ServiceMetrics
from retriever_server.index.corpus import Corpus
from retriever_server.passages import split_contents

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
        self.articles = CorpusArticles(corpus)

    def __len__(self) -> int:
        return len(self.corpus)

    async def rows(self, hits: list[list[Hit]]) -> list[list[Document]]:
        doc = self.corpus.document
        return [[doc(p) for p, _ in row] for row in hits]


MAX_ARTICLE_ROWS = 2000
"""Most corpus rows an article is looked for in, either side of the hit (a bound on one request's reads)."""


def article(corpus: Corpus, position: int, max_chars: int) -> dict[str, object]:
    """The article of the row at ``position``: the adjacent rows that share its title (wiki-18 splits an article into
    consecutive 100-word passages), texts joined by a space and cut to ``max_chars`` characters. Rows are read
    outward from the hit only while the text can still grow, so a long article costs ``max_chars``, not its size."""
    title, _ = split_contents(corpus.store.contents(position))
    first = position
    while (
        first > 0
        and position - first < MAX_ARTICLE_ROWS
        and split_contents(corpus.store.contents(first - 1))[0] == title
    ):
        first -= 1
    texts, chars, row = [], 0, first
    while row < len(corpus) and chars <= max_chars:
        row_title, text = split_contents(corpus.store.contents(row))
        if row_title != title:
            break
        texts.append(text)
        chars += len(text) + 1
        row += 1
    while (
        row < len(corpus) and row - first < MAX_ARTICLE_ROWS and split_contents(corpus.store.contents(row))[0] == title
    ):
        row += 1  # count the article's remaining rows (bounded)
    text = " ".join(texts)
    return {"title": title, "text": text[:max_chars], "passages": row - first, "truncated": len(text) > max_chars}


class CorpusArticles:
    """Articles by document id from a local corpus: an id equal to its row number (wiki-18's layout) is found
    directly, any other through an id index built on first use."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus
        self._positions: dict[str, int] | None = None

    def position(self, doc_id: str) -> int | None:
        """The row of ``doc_id``, or None."""
        if (
            doc_id.isascii()
            and doc_id.isdigit()
            and int(doc_id) < len(self.corpus)
            and self.corpus.store.doc_id(int(doc_id)) == doc_id
        ):
            return int(doc_id)
        if self._positions is None:
            self._positions = {d: i for i, d in enumerate(self.corpus.ids)}
        return self._positions.get(doc_id)

    def articles(self, ids: list[str], max_chars: int) -> list[dict[str, object] | None]:
        out: list[dict[str, object] | None] = []
        for doc_id in ids:
            pos = self.position(doc_id)
            out.append(None if pos is None else {"id": doc_id, **article(self.corpus, pos, max_chars)})
        return out


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
