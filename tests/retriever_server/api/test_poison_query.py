"""A poison query among concurrent valid clients, against a real dense server (MiniLM + FAISS over 20 shipped
passages): ``python -m pytest tests/retriever_server/api/test_poison_query.py``.

Issue 16: ``"nobel \\ud800 prize"`` (a lone surrogate, sent as a raw JSON escape) made the dense tokenizer raise; sent
alongside 40 valid requests it failed 27-30 of them with 500, because they shared its coalesced batch, and the
trainer's client retried the 500s. The dense backend is the point here: BM25's tokenizer does not raise on it.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator

import httpx
import pytest

from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import SHIPPED_CORPUS

pytestmark = [pytest.mark.slow, pytest.mark.integration]

POISON = b'{"queries": ["nobel \\ud800 prize"], "topk": 3}'


@pytest.fixture(scope="module")
def dense_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    corpus = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    with gzip.open(SHIPPED_CORPUS, "rt", encoding="utf-8") as f:
        corpus.write_text("".join(line for line, _ in zip(f, range(20), strict=False)), encoding="utf-8")
    env = {
        "RETRIEVER_METHOD": "dense",
        "RETRIEVER_CORPUS_PATH": str(corpus),
        "RETRIEVER_INDEX_DIR": str(tmp_path_factory.mktemp("idx")),
        "RETRIEVER_SHOW_PROGRESS": "false",
        "RETRIEVER_CACHE_SIZE": "0",
    }
    with RetrieverProcess(env=env, ready_timeout_s=600) as server:
        yield server.url


def test_poison_query_is_422_and_concurrent_clients_are_unaffected(dense_url: str) -> None:
    queries = [[f"who won the nobel prize in physics in {1901 + i}", f"physics laureate number {i}"] for i in range(40)]
    with httpx.Client(base_url=dense_url, timeout=60) as client:
        alone = [client.post("/retrieve", json={"queries": q, "topk": 3}).json() for q in queries]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=dense_url, timeout=60, limits=httpx.Limits(max_connections=50)) as c:
            valid = [c.post("/retrieve", json={"queries": q, "topk": 3}) for q in queries]
            poison = c.post("/retrieve", content=POISON, headers={"content-type": "application/json"})
            return await asyncio.gather(*valid[:20], poison, *valid[20:])

    for _ in range(3):  # the issue saw 27-30 failures in each of three trials
        responses = asyncio.run(burst())
        poisoned = responses.pop(20)
        assert poisoned.status_code == 422, poisoned.text
        assert poisoned.json()["detail"][0]["loc"] == ["body", "queries", 0]
        assert [r.status_code for r in responses] == [200] * 40
        assert [r.json() for r in responses] == alone
