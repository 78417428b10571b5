"""The HTTP contract against a real uvicorn server (BM25 over the shipped corpus):
``python -m pytest tests/retriever_server/api/test_api.py``.
"""

from __future__ import annotations

import asyncio
import json

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


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data", None]
)
def test_body_not_declared_json_is_415(retriever_url: str, content_type: str | None) -> None:
    """Browsers post these types to any site without a CORS preflight; a page must not reach the retriever."""
    headers = {"content-type": content_type} if content_type else {}
    r = httpx.post(f"{retriever_url}/retrieve", content=b'{"queries": ["paris"], "topk": 1}', headers=headers)
    assert r.status_code == 415, r.text
    assert "Content-Type: application/json" in r.json()["detail"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/vnd.search+json"])
def test_json_content_types_are_accepted(retriever_url: str, content_type: str) -> None:
    r = httpx.post(
        f"{retriever_url}/retrieve",
        content=b'{"queries": ["paris"], "topk": 1}',
        headers={"content-type": content_type},
    )
    assert r.status_code == 200 and len(r.json()["result"][0]) == 1


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"queries": "just a string"}, ["body", "queries"]),
        ({"queries": ["ok", 3]}, ["body", "queries", 1]),
        ({"queries": ["ok", ""]}, ["body", "queries", 1]),
        ({"queries": ["   "]}, ["body", "queries", 0]),
        ({"queries": ["\x1c\ufeff"]}, ["body", "queries", 0]),
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
    stream = iter([b'{"queries": ["', b"a" * 5_000_000, b'"]}'])  # no content-length: cut off while streaming
    chunked = httpx.post(f"{retriever_url}/retrieve", content=stream, headers={"content-type": "application/json"})
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


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (b'{"queries": ["a b"], "topk": NaN}', ["body", "topk"]),
        (b'{"queries": ["a b"], "topk": 1e400}', ["body", "topk"]),
        (b'{"queries": ["a b"], "topk": -Infinity}', ["body", "topk"]),
        (b'{"queries": NaN}', ["body", "queries"]),
        (b'{"queries": ["a", Infinity]}', ["body", "queries", 1]),
    ],
)
def test_non_finite_numbers_are_422_not_500(retriever_url: str, raw: bytes, loc: list[object]) -> None:
    """Python's JSON parser reads NaN/Infinity/1e400; the 422 that echoes them must still be valid JSON."""
    r = httpx.post(f"{retriever_url}/retrieve", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert any(err["loc"] == loc for err in r.json()["detail"]), r.json()


def test_lone_surrogate_is_422_naming_the_query(retriever_url: str) -> None:
    """``"\\ud800"`` unpaired is valid JSON but not Unicode; the dense tokenizer raises on it."""
    raw = b'{"queries": ["paris", "nobel \\ud800 prize"]}'
    r = httpx.post(f"{retriever_url}/retrieve", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "queries", 1] and "surrogate" in err["msg"] and "\\ud800" in err["input"]
    assert post(retriever_url, {"queries": ["nobel \U0001f3c6 prize"]}).status_code == 200  # a paired one is fine


def test_bm25_returns_only_matching_documents(retriever_url: str) -> None:
    body = {"queries": ["zzqxv vwqqz", "the of and", "Röntgen"], "topk": 100, "return_scores": True}
    none, stopwords, rare = post(retriever_url, body).json()["result"]
    assert none == [] and stopwords == []
    assert 0 < len(rare) < 100 and all(h["score"] > 0 for h in rare)
    assert all("Röntgen" in h["document"]["contents"] or "Rontgen" in h["document"]["contents"] for h in rare[:3])


@pytest.mark.parametrize("host", ["evil.example", "attacker.test:8000", "192.0.2.7"])
def test_foreign_host_header_is_400(retriever_url: str, host: str) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    for path in ("/retrieve", "/health"):
        r = httpx.request(
            "POST" if path == "/retrieve" else "GET",
            f"{retriever_url}{path}",
            json={"queries": ["paris"]} if path == "/retrieve" else None,
            headers={"host": host},
        )
        assert r.status_code == 400 and "RETRIEVER_ALLOWED_HOSTS" in r.json()["detail"], r.text


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "LOCALHOST:1234", "[::1]:8000"])
def test_loopback_host_headers_are_accepted(retriever_url: str, host: str) -> None:
    r = httpx.post(f"{retriever_url}/retrieve", json={"queries": ["paris"]}, headers={"host": host})
    assert r.status_code == 200, r.text


def test_request_from_another_sites_page_is_403(retriever_url: str) -> None:
    evil = httpx.post(f"{retriever_url}/retrieve", json={"queries": ["x"]}, headers={"origin": "https://evil.example"})
    assert evil.status_code == 403 and "evil.example" in evil.json()["detail"]
    own_docs_page = httpx.post(f"{retriever_url}/retrieve", json={"queries": ["x"]}, headers={"origin": retriever_url})
    assert own_docs_page.status_code == 200  # the server's own /docs page may call it


def test_health_shows_no_absolute_paths(retriever_url: str) -> None:
    body = httpx.get(f"{retriever_url}/health").json()
    assert body["index_path"].startswith("bm25-") and "/" not in body["index_path"]
    assert "/" not in json.dumps(body)


def test_openapi_document_states_the_limits_and_statuses(retriever_url: str) -> None:
    doc = httpx.get(f"{retriever_url}/openapi.json").json()
    props = doc["components"]["schemas"]["RetrieveRequest"]["properties"]
    assert props["queries"]["maxItems"] == 1024 and props["queries"]["items"]["maxLength"] == 2048
    assert props["queries"]["items"]["minLength"] == 1 and "pattern" in props["queries"]["items"]
    assert any(o.get("maximum") == 100 for o in props["topk"]["anyOf"])
    responses = doc["paths"]["/retrieve"]["post"]["responses"]
    assert {"200", "400", "413", "415", "422", "503"} <= set(responses)
    assert "Retry-After" in responses["503"]["headers"]
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
