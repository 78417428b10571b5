"""The default service (dense MiniLM + FAISS Flat over the shipped corpus) as ``make demo`` starts it:
``python -m pytest tests/retriever_server/api/test_dense_server.py``.

The first run on a machine builds the dense index (minutes); later runs load it from the cache.
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_gold_passage_first_for_the_nobel_question(dense_retriever_url: str) -> None:
    r = httpx.post(
        f"{dense_retriever_url}/retrieve",
        json={"queries": ["who got the first nobel prize in physics"], "topk": 3, "return_scores": True},
        timeout=60,
    )
    assert r.status_code == 200
    top = r.json()["result"][0]
    assert top[0]["document"]["contents"].startswith('"List of Nobel laureates in Physics"\n')
    assert "awarded in 1901 to Wilhelm Conrad Röntgen" in top[0]["document"]["contents"]
    assert 0 < top[0]["score"] <= 1.0001 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]  # cosine


def test_health_names_the_dense_index(dense_retriever_url: str) -> None:
    body = httpx.get(f"{dense_retriever_url}/health").json()
    assert body["status"] == "ready" and body["method"] == "dense"
    assert body["encoder_model"] == "all-MiniLM-L6-v2" and "dense-" in body["index_path"]
