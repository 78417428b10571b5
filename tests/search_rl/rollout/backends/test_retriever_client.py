"""RetrieverClient against a real uvicorn retriever (BM25 over the shipped corpus), plus failures a real server
cannot be made to produce on demand (503 then success, malformed answers, a socket that never answers).

Run: python -m pytest tests/search_rl/rollout/backends/test_retriever_client.py -q
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from search_rl.config import RetrieverClientConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends.retriever_client import RetrieverClient, RetrieverError, retry_after_s

DEAD_URL = "http://127.0.0.1:9"  # discard port: connection refused


def _client(url: str, transport=None, **kw) -> RetrieverClient:
    kw = {"backoff_s": 0.01, "backoff_max_s": 0.02, "timeout_s": 10.0} | kw
    return RetrieverClient(RetrieverClientConfig(url=url, **kw), transport=transport)


@pytest.mark.integration
def test_search_returns_parsed_passages(retriever_url):
    client = _client(retriever_url, topk=3)
    results = asyncio.run(client.search(["Nobel Prize in Physics first laureate", "Deadpool 2 release date"]))
    assert len(results) == 2 and all(len(r) == 3 for r in results)
    for hits in results:
        for p in hits:
            assert isinstance(p, Passage) and p.id and p.text and p.score is not None
            assert not p.title.startswith('"'), "the corpus's quotes around titles are removed"
    assert any("Deadpool" in p.title for p in results[1])


@pytest.mark.integration
def test_chunking_gives_the_same_results_as_one_request(retriever_url):
    queries = [f"history of city number {i}" for i in range(7)] + ["Deadpool 2", "Nobel Prize in Physics"]
    one = _client(retriever_url, max_queries_per_request=64)
    chunked = _client(retriever_url, max_queries_per_request=2, max_concurrency=2)
    a, b = asyncio.run(one.search(queries)), asyncio.run(chunked.search(queries))
    assert [[p.id for p in r] for r in a] == [[p.id for p in r] for r in b]
    assert sum(one.requests_by_url.values()) == 1 and sum(chunked.requests_by_url.values()) == 5


@pytest.mark.integration
def test_round_robin_fails_over_from_a_dead_replica(retriever_url):
    client = _client(f"{DEAD_URL},{retriever_url}/retrieve", max_queries_per_request=1, max_retries=1)
    results = asyncio.run(client.search(["Deadpool 2", "Nobel Prize", "Strasbourg", "Nigeria"]))
    assert len(results) == 4 and all(results)
    # chunks start on alternating replicas; the ones sent to the dead one were retried on the live one
    assert client.requests_by_url[DEAD_URL] == 2 and client.requests_by_url[retriever_url] == 4
    assert client.retries == 2 and client.failures == 0


def test_dead_retriever_raises_naming_url_and_command():
    client = _client(DEAD_URL, max_retries=2)
    with pytest.raises(RetrieverError) as info:
        asyncio.run(client.search(["q"]))
    msg = str(info.value)
    assert DEAD_URL in msg and "uvicorn retriever_server.app:app" in msg and "3 attempt(s)" in msg
    assert info.value.url == DEAD_URL and client.retries == 2 and client.failures == 1


@pytest.mark.integration
def test_check_reachable(retriever_url):
    _client(retriever_url).check_reachable()
    with pytest.raises(RetrieverError, match="127.0.0.1:9 is not reachable.*uvicorn retriever_server.app:app"):
        _client(f"{retriever_url},{DEAD_URL}").check_reachable(timeout_s=2)


def _ok_body(queries: list[str]) -> dict:
    return {"result": [[{"document": {"id": "1", "contents": f'"T"\n{q}'}, "score": 1.0}] for q in queries]}


def test_5xx_is_retried_then_succeeds():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, text="index loading")
        return httpx.Response(200, json=_ok_body(["q"]))

    client = _client("http://r", httpx.MockTransport(handler), max_retries=3)
    assert asyncio.run(client.search(["q"]))[0][0] == Passage("1", "T", "q", 1.0)
    assert len(calls) == 3 and client.retries == 2


def test_an_overloaded_servers_retry_after_is_honoured_within_the_window():
    calls: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) == 1:  # the retriever's load shedding: 503 with the seconds until its queue drains
            return httpx.Response(503, headers={"Retry-After": "0.5"}, text="overloaded: retry in 0.5s")
        return httpx.Response(200, json=_ok_body(["q"]))

    client = _client("http://r", httpx.MockTransport(handler))  # backoff 0.01 s: the header decides
    assert asyncio.run(client.search(["q"]))[0][0] == Passage("1", "T", "q", 1.0)
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.5
    # a Retry-After longer than the rest of the window is cut to it; a shorter one leaves the backoff
    assert _client("http://r", retry_window_s=2.0)._retry_delay(0, 1.5, 30.0) == pytest.approx(0.5)
    assert _client("http://r", backoff_s=1.0, backoff_max_s=4.0)._retry_delay(1, 0.0, 0.5) == 2.0
    assert retry_after_s("7") == 7.0 and retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") is None


@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (422, {"detail": "topk too large"}, "HTTP 422"),
        (200, {"result": []}, "malformed answer.*expected 1 result lists"),
        (200, {"unexpected": 1}, "malformed answer"),
    ],
)
def test_client_errors_and_malformed_answers_are_not_retried(status, body, match):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(status, json=body)

    client = _client("http://r", httpx.MockTransport(handler), max_retries=3)
    with pytest.raises(RetrieverError, match=match):
        asyncio.run(client.search(["q"]))
    assert len(calls) == 1


def test_concurrency_limit_and_order_are_kept():
    in_flight, peak = 0, 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        queries = __import__("json").loads(request.content)["queries"]
        return httpx.Response(200, json=_ok_body(queries))

    client = _client("http://r", httpx.MockTransport(handler), max_queries_per_request=3, max_concurrency=2)
    queries = [f"q{i}" for i in range(20)]
    results = asyncio.run(client.search(queries))
    assert [r[0].text for r in results] == queries
    assert peak == 2 and sum(client.requests_by_url.values()) == 7


def test_timeout_on_a_server_that_never_answers():
    """A real socket that accepts connections and never replies: each attempt times out, then RetrieverError."""

    async def scenario() -> tuple[RetrieverError, float]:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = _client(f"http://127.0.0.1:{port}", timeout_s=0.3, max_retries=1)
        start = time.perf_counter()
        try:
            await client.search(["q"])
        except RetrieverError as e:
            return e, time.perf_counter() - start
        finally:
            server.close()
        raise AssertionError("no RetrieverError")

    err, elapsed = asyncio.run(scenario())
    assert "ReadTimeout" in str(err) and "2 attempt(s)" in str(err)
    assert elapsed < 30  # two attempts of 0.3 s, not retried for the default window (a generous bound)


def test_client_survives_successive_event_loops():
    client = _client("http://r", httpx.MockTransport(lambda r: httpx.Response(200, json=_ok_body(["a"]))))
    for _ in range(2):
        assert len(asyncio.run(client.search(["a"]))) == 1


def test_config_url_parsing_and_validation():
    cfg = RetrieverClientConfig(url="http://a:8000/retrieve, http://b:8000/ ,")
    assert cfg.urls == ["http://a:8000", "http://b:8000"]
    with pytest.raises(ValueError, match="retriever.url is empty"):
        RetrieverClientConfig(url=" , ")
    with pytest.raises(ValueError, match="retriever.topk"):
        RetrieverClientConfig(topk=0)
