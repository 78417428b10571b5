"""The articles of a sharded index (``ShardDocuments.articles``) equal the one-process ones (``CorpusArticles`` on the
whole corpus), without Ray: fake shard handles run each shard's own ``CorpusArticles`` and are awaited as handles
are. Articles cross one or two shard boundaries, end or begin exactly at one, and hit the row bound
(``MAX_ARTICLE_ROWS``); every ``max_chars`` from 1 to past the longest article is asked.

Run: python -m pytest tests/retriever_server/serve/test_shard_articles.py -q
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from retriever_server.api import service
from retriever_server.api.schemas import ShardInfo
from retriever_server.api.service import CorpusArticles
from retriever_server.index.corpus import load_corpus
from retriever_server.serve import deployment
from retriever_server.serve.deployment import ShardDocuments

SHARD_ROWS = 4
TITLES = "A A B B | B B B B | B C C C | D D E E".replace("| ", "").split()
"""Row titles, four shards of four rows: B crosses two boundaries, C ends at one and D begins at one."""
IDS = [*(str(i) if i % 2 else f"doc-{i}" for i in range(len(TITLES))), "unknown", "99"]
"""Odd rows have their row number as id (found directly), even rows another (found through the id index)."""


class FakeRemote:
    """A handle's method: ``.remote(...)`` gives an awaitable of the method's answer."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method

    def remote(self, *args: Any) -> Awaitable[Any]:
        async def answer() -> Any:
            return self.method(*args)

        return answer()


class FakeShard:
    """An ``IndexShard``'s article methods over its ``CorpusArticles``, as ``IndexShard`` builds it."""

    def __init__(self, lookup: CorpusArticles) -> None:
        self.articles = FakeRemote(lookup.parts)
        self.article_part = FakeRemote(lookup.part)


def write_rows(path: Path, rows: range) -> Path:
    lines = (json.dumps({"id": IDS[i], "contents": f'"{TITLES[i]}"\nrow{i} ' + "x" * (3 * i % 7)}) for i in rows)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def sharded(tmp_path: Path, own_stores: bool) -> ShardDocuments:
    """Four shards that hold their own rows (``index_convert --shards --corpus``) or each read the whole corpus."""
    whole = load_corpus(write_rows(tmp_path / "whole.jsonl", range(len(TITLES))), tmp_path / "stores")
    shards, infos = [], []
    for offset in range(0, len(TITLES), SHARD_ROWS):
        own = range(offset, offset + SHARD_ROWS)
        if own_stores:
            corpus = load_corpus(write_rows(tmp_path / f"shard{offset}.jsonl", own), tmp_path / "stores")
            lookup = CorpusArticles(corpus, offset, own)
        else:
            lookup = CorpusArticles(whole, 0, own)
        shards.append(FakeShard(lookup))
        infos.append(ShardInfo(index=f"shard{offset}", rows=SHARD_ROWS, offset=offset, node="n"))
    return ShardDocuments(shards, infos)


@pytest.mark.parametrize("max_rows", [service.MAX_ARTICLE_ROWS, 3])
@pytest.mark.parametrize("own_stores", [True, False], ids=["own-stores", "whole-corpus"])
def test_sharded_articles_equal_the_one_process_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_stores: bool, max_rows: int
) -> None:
    monkeypatch.setattr(service, "MAX_ARTICLE_ROWS", max_rows)
    monkeypatch.setattr(deployment, "MAX_ARTICLE_ROWS", max_rows)
    documents = sharded(tmp_path, own_stores)
    whole = CorpusArticles(load_corpus(tmp_path / "whole.jsonl", tmp_path / "stores"))
    longest = 0
    for max_chars in range(1, 90):
        expected = whole.articles(IDS, max_chars)
        assert asyncio.run(documents.articles(IDS, max_chars)) == expected, max_chars
        longest = max(longest, *(len(str(a["text"])) for a in expected if a is not None))
    assert longest < 89  # the last max_chars cut nothing
    b = whole.articles(["doc-8"], 10)[0]
    assert b is not None and b["passages"] == min(7, max_rows) and b["truncated"]


def test_a_crossing_article_is_joined_across_two_boundaries(tmp_path: Path) -> None:
    documents = sharded(tmp_path, own_stores=True)
    [b, c, d] = asyncio.run(documents.articles(["5", "9", "doc-12"], 1000))
    assert b == {"id": "5", "title": "B", "passages": 7, "truncated": False, "text": b["text"]}
    assert str(b["text"]).startswith("row2") and " row8" in str(b["text"])
    assert c is not None and d is not None and (c["passages"], d["passages"]) == (3, 2)
