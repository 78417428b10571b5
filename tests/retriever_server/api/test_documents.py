"""``POST /documents``: a document's whole article (the rollout's ``open`` tool), unit-tested on a small corpus
(``article``: adjacent rows sharing the title, cut to ``max_chars``) and served by a real uvicorn server (BM25 over
the shipped corpus): shape, unknown ids, limits.

Run: python -m pytest tests/retriever_server/api/test_documents.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from retriever_server.api.service import CorpusArticles, article
from retriever_server.index.corpus import load_corpus


def test_an_article_is_the_run_of_rows_with_the_hits_title(tmp_path: Path):
    rows = [("a0", "A", "one"), ("a1", "A", "two"), ("b", "B", "other"), ("a2", "A", "three")]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in rows))
    corpus = load_corpus(path, tmp_path / "stores")
    assert article(corpus, 1, 100) == {"title": "A", "text": "one two", "passages": 2, "truncated": False}
    assert article(corpus, 0, 5) == {"title": "A", "text": "one t", "passages": 2, "truncated": True}
    assert article(corpus, 3, 100)["text"] == "three"
    found = CorpusArticles(corpus).articles(["a1", "b", "zz"], 100)
    assert [f and f["id"] for f in found] == ["a1", "b", None]


def test_the_server_serves_articles(retriever_url: str):
    with httpx.Client(base_url=retriever_url, timeout=30) as client:
        resp = client.post("/documents", json={"ids": ["1", "no-such-id"], "max_chars": 10})
        assert resp.status_code == 200, resp.text
        first, missing = resp.json()["result"]
        assert first == {"id": "1", "title": "Deadpool 2", "text": "Deadpool 2", "passages": 1, "truncated": True}
        assert missing is None
        for bad in ({"ids": []}, {"ids": ["1"] * 65}, {"ids": ["1"], "max_chars": 0}, {"ids": ["1"], "x": 1}):
            assert client.post("/documents", json=bad).status_code == 422, bad
