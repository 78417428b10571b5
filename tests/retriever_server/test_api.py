"""The HTTP contract against a real uvicorn server (BM25 over the shipped corpus):
``python -m pytest tests/retriever_server/test_api.py``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = pytest.mark.integration

NOBEL = "who got the first nobel prize in physics"


def post(url: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json=body, timeout=30, **kw)  # type: ignore[arg-type]


def test_health_reports_ready_index(retriever_url: str) -> None:
    r = httpx.get(f"{retriever_url}/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ready" and body["method"] == "bm25" and body["num_documents"] > 16_000


def test_scored_shape_and_order(retriever_url: str) -> None:
    r = post(retriever_url, {"queries": [NOBEL, "capital of france"], "topk": 5, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and all(len(row) == 5 for row in result)
    for row in result:
        for hit in row:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
        scores = [h["score"] for h in row]
        assert scores == sorted(scores, reverse=True)
    assert "Röntgen" in result[0][0]["document"]["contents"]


def test_unscored_shape_is_bare_documents(retriever_url: str) -> None:
    """Search-R1's own server crashes on return_scores=false; ours returns the documents."""
    scored = post(retriever_url, {"queries": [NOBEL], "topk": 3, "return_scores": True}).json()["result"]
    bare = post(retriever_url, {"queries": [NOBEL], "topk": 3}).json()["result"]
    assert bare == [[h["document"] for h in scored[0]]]


def test_default_topk_is_three(retriever_url: str) -> None:
    r = post(retriever_url, {"queries": [NOBEL], "return_scores": True})
    assert len(r.json()["result"][0]) == 3


def test_empty_query_list_gives_empty_result(retriever_url: str) -> None:
    assert post(retriever_url, {"queries": []}).json() == {"result": []}


def test_form_encoded_body_is_read_as_json(retriever_url: str) -> None:
    """``curl -d '{...}'`` sends application/x-www-form-urlencoded; the body is still JSON."""
    r = httpx.post(
        f"{retriever_url}/retrieve",
        content=b'{"queries": ["paris"], "topk": 1}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and len(r.json()["result"][0]) == 1


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"queries": "just a string"}, ["body", "queries"]),
        ({"queries": ["ok", 3]}, ["body", "queries", 1]),
        ({"queries": ["ok", ""]}, ["body", "queries"]),
        ({"queries": ["   "]}, ["body", "queries"]),
        ({"queries": ["ok"], "topk": 0}, ["body", "topk"]),
        ({"queries": ["ok"], "topk": -2}, ["body", "topk"]),
        ({"queries": ["ok"], "topk": 101}, ["body", "topk"]),
        ({"queries": ["ok"], "topk": "3"}, ["body", "topk"]),
        ({"queries": ["ok"], "topk": True}, ["body", "topk"]),
        ({"queries": ["ok"], "return_scores": "yes"}, ["body", "return_scores"]),
        ({"queries": ["ok"], "top_k": 3}, ["body", "top_k"]),
        ({"topk": 3}, ["body", "queries"]),
        ({"queries": ["q"] * 1025}, ["body", "queries"]),
        ({"queries": ["x" * 2049]}, ["body", "queries", 0]),
        ([1, 2], ["body"]),
    ],
)
def test_bad_input_is_422_naming_the_field(retriever_url: str, body: object, loc: list[object]) -> None:
    r = post(retriever_url, body)
    assert r.status_code == 422, r.text
    assert any(err["loc"] == loc for err in r.json()["detail"]), r.json()


def test_malformed_json_is_422(retriever_url: str) -> None:
    r = httpx.post(f"{retriever_url}/retrieve", content=b'{"queries": [', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"


def test_oversized_body_is_413_and_server_keeps_serving(retriever_url: str) -> None:
    big = {"queries": ["word " * 400] * 2200}  # ~4.4 MB, over the default 4 MiB limit
    r = post(retriever_url, big)
    assert r.status_code == 413 and "RETRIEVER_MAX_BODY_BYTES" in r.json()["detail"]
    chunked = httpx.post(f"{retriever_url}/retrieve", content=iter([b'{"queries": ["', b"a" * 5_000_000, b'"]}']))
    assert chunked.status_code == 413
    assert post(retriever_url, {"queries": [NOBEL]}).status_code == 200


def test_wrong_method_and_path(retriever_url: str) -> None:
    assert httpx.get(f"{retriever_url}/retrieve").status_code == 405
    assert httpx.get(f"{retriever_url}/nope").status_code == 404


def test_metrics_count_requests_batches_and_cache(retriever_url: str) -> None:
    post(retriever_url, {"queries": ["metrics probe query"]})
    post(retriever_url, {"queries": ["metrics probe query"]})
    text = httpx.get(f"{retriever_url}/metrics").text
    for name in (
        "retriever_requests_total",
        "retriever_request_latency_seconds_bucket",
        "retriever_batch_queries_bucket",
        "retriever_cache_hits_total",
        "retriever_cache_misses_total",
    ):
        assert name in text
    hits = next(line for line in text.splitlines() if line.startswith("retriever_cache_hits_total"))
    assert float(hits.split()[-1]) >= 1


def test_200_concurrent_requests_equal_sequential_answers(retriever_url: str) -> None:
    queries = [[f"history of city number {i}", f"who wrote book {i}", f"river {i} length"] for i in range(200)]
    sequential = [
        post(retriever_url, {"queries": q, "topk": 1 + i % 5, "return_scores": True}).json()
        for i, q in enumerate(queries)
    ]

    async def fire() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=retriever_url, timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *[
                    client.post("/retrieve", json={"queries": q, "topk": 1 + i % 5, "return_scores": True})
                    for i, q in enumerate(queries)
                ]
            )

    concurrent = asyncio.run(fire())
    assert all(r.status_code == 200 for r in concurrent)
    assert [r.json() for r in concurrent] == sequential
