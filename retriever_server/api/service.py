"""Search service: the LRU result cache in front of the query batcher, where the documents of hits come from, and
the articles of document ids (the rows around a document that share its title, read in parts a sharded index joins)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
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
    """The documents at ranked positions and the articles of ids: the local corpus, or the shards of a Ray Serve
    index."""

    def __len__(self) -> int: ...

    async def rows(self, hits: list[list[Hit]]) -> list[list[Document]]:
        """The document of every hit, in the shape of ``hits``."""
        ...

    async def articles(self, ids: list[str], max_chars: int) -> list[dict[str, object] | None]:
        """The article of each id (``article``, with its ``id``), or None for an id the corpus does not have."""
        ...


class CorpusDocuments:
    """Documents read from a corpus in this process (a memory-mapped store: a lookup is a slice)."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus
        self.lookup = CorpusArticles(corpus)

    def __len__(self) -> int:
        return len(self.corpus)

    async def rows(self, hits: list[list[Hit]]) -> list[list[Document]]:
        doc = self.corpus.document
        return [[doc(p) for p, _ in row] for row in hits]

    async def articles(self, ids: list[str], max_chars: int) -> list[dict[str, object] | None]:
        return await asyncio.to_thread(self.lookup.articles, ids, max_chars)


MAX_ARTICLE_ROWS = 2000
"""Most corpus rows an article is looked for in, either side of the hit (a bound on one request's reads)."""
RowReader = Callable[[int], tuple[str, str]]
"""(title, text) of the row at a position."""


@dataclass(frozen=True)
class ArticlePart:
    """The rows of an article within a range of consecutive rows: rows ``first .. end`` share ``title``; ``texts`` are
    the texts of the first of them, read while the article's text could still grow."""

    title: str
    first: int
    end: int
    texts: tuple[str, ...]
    open_before: bool
    """``first`` is the range's first row and not the corpus's: the article may begin in the range before."""
    open_after: bool
    """``end`` is the range's end: the article may go on in the range after (unless the corpus ends there)."""


def article_part(read: RowReader, rows: range, title: str, position: int, start: int, max_chars: int) -> ArticlePart:
    """The part of the article titled ``title`` that holds row ``start``, within ``rows``: rows are read back from
    ``start`` while they share the title (at most MAX_ARTICLE_ROWS before ``position``, the hit's row), then forward
    from the first, texts only while the text can still grow and titles up to MAX_ARTICLE_ROWS rows from the first.

    ``start`` is the hit's row, or a range end where an article crosses from a neighbouring range (``rows.stop``:
    the article's rows at the range's end; ``rows.start``: at its start).
    """
    first = start
    while first > rows.start and position - first < MAX_ARTICLE_ROWS and read(first - 1)[0] == title:
        first -= 1
    texts, chars, end = [], 0, first
    while end < rows.stop and chars <= max_chars:
        row_title, text = read(end)
        if row_title != title:
            break
        texts.append(text)
        chars += len(text) + 1
        end += 1
    while end < rows.stop and end - first < MAX_ARTICLE_ROWS and read(end)[0] == title:
        end += 1  # count the article's remaining rows (bounded)
    before = first == rows.start and first > 0 and position - first < MAX_ARTICLE_ROWS
    return ArticlePart(title, first, end, tuple(texts), before, end == rows.stop)


def joined_article(parts: list[ArticlePart], max_chars: int) -> dict[str, object]:
    """The article made of consecutive parts (in row order, each ending where the next begins, the last not open
    unless the rest cannot change the answer): their texts read again as one run, joined by a space and cut to
    ``max_chars``; ``passages`` counts the rows from the first part's first, up to MAX_ARTICLE_ROWS unless more
    texts were read."""
    first = parts[0].first
    texts: list[str] = []
    chars = 0
    for text in (t for part in parts for t in part.texts):
        if chars > max_chars:
            break
        texts.append(text)
        chars += len(text) + 1
    # a part counts up to MAX_ARTICLE_ROWS from its own first row: bound the count from the article's first
    end = max(first + len(texts), min(parts[-1].end, first + MAX_ARTICLE_ROWS))
    text = " ".join(texts)
    return {
        "title": parts[0].title,
        "text": text[:max_chars],
        "passages": end - first,
        "truncated": len(text) > max_chars,
    }


def article(corpus: Corpus, position: int, max_chars: int) -> dict[str, object]:
    """The article of the row at ``position``: the adjacent rows that share its title (wiki-18 splits an article into
    consecutive 100-word passages), texts joined by a space and cut to ``max_chars`` characters. Rows are read outward
    from the hit only while the text can still grow, so a long article costs ``max_chars``, not its size."""

    def read(row: int) -> tuple[str, str]:
        return split_contents(corpus.store.contents(row))

    part = article_part(read, range(len(corpus)), read(position)[0], position, position, max_chars)
    return joined_article([part], max_chars)


class CorpusArticles:
    """Articles by document id from a local corpus: an id equal to its row number (wiki-18's layout) is found
    directly, any other through an id index built on first use.

    A shard of a larger corpus numbers rows globally: its corpus holds rows from ``first_row`` on (its own rows, or
    the whole corpus with ``first_row`` 0), and it answers only ids among ``own`` (its rows of the index), with the
    part of their article within its corpus (``parts``) for the caller to complete from the neighbouring shards.
    """

    def __init__(self, corpus: Corpus, first_row: int = 0, own: range | None = None) -> None:
        self.corpus = corpus
        self.rows = range(first_row, first_row + len(corpus))
        self.own = self.rows if own is None else own
        self._positions: dict[str, int] | None = None

    def read(self, row: int) -> tuple[str, str]:
        """(title, text) of global row ``row``."""
        return split_contents(self.corpus.store.contents(row - self.rows.start))

    def position(self, doc_id: str) -> int | None:
        """The global row of ``doc_id``, or None (also for a row outside ``own``)."""
        local: int | None = None
        guess = int(doc_id) - self.rows.start if doc_id.isascii() and doc_id.isdigit() else -1
        if 0 <= guess < len(self.corpus) and self.corpus.store.doc_id(guess) == doc_id:
            local = guess
        else:
            if self._positions is None:
                self._positions = {d: i for i, d in enumerate(self.corpus.ids)}
            local = self._positions.get(doc_id)
        return None if local is None or local + self.rows.start not in self.own else local + self.rows.start

    def parts(self, ids: list[str], max_chars: int) -> list[tuple[int, ArticlePart] | None]:
        """(row, the part of its article within this corpus) of each id, or None."""
        out: list[tuple[int, ArticlePart] | None] = []
        for doc_id in ids:
            row = self.position(doc_id)
            if row is None:
                out.append(None)
                continue
            out.append((row, article_part(self.read, self.rows, self.read(row)[0], row, row, max_chars)))
        return out

    def part(self, title: str, position: int, start: int, max_chars: int) -> ArticlePart:
        """The part of the article titled ``title`` (hit at ``position``, elsewhere) that holds ``start``, an end of
        ``own``, within ``own``: where an article crosses into these rows from a neighbour's."""
        return article_part(self.read, self.own, title, position, start, max_chars)

    def articles(self, ids: list[str], max_chars: int) -> list[dict[str, object] | None]:
        """The article of each id, or None: for a corpus that is the whole corpus, where a part is the article."""
        return [
            None if p is None else {"id": doc_id, **joined_article([p[1]], max_chars)}
            for doc_id, p in zip(ids, self.parts(ids, max_chars), strict=True)
        ]


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
