"""``retriever.backend=web``: the Serper and Brave adapters against a local HTTP server answering in each provider's
documented format (results, 429 with the provider's wait header, 5xx, malformed and empty answers), the budget
stopping a recorded run with every paid answer kept, and the API key never in a log line or an error.

Run: python -m pytest tests/search_rl/rollout/backends/test_web_backends.py -q
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from search_rl.config import RetrieverClientConfig
from search_rl.config.search_backends import RecordingConfig, WebSearchConfig
from search_rl.rollout.backends import RetrieverError, build_retriever
from search_rl.rollout.backends.web import SearchBudgetExhausted, WebBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[4]
KEY = "sk-test-7d1c55e0a9"
SERPER_OK = {
    "searchParameters": {"q": "eiffel tower height", "gl": "us", "hl": "en", "type": "search", "num": 2},
    "knowledgeGraph": {"title": "Eiffel Tower", "type": "Tower"},
    "organic": [
        {"title": "Eiffel Tower - Wikipedia", "link": "https://en.wikipedia.org/wiki/Eiffel_Tower",
         "snippet": "The tower is 330 metres tall.", "position": 1},
        {"title": "Facts", "link": "https://example.org/facts", "snippet": "Built in 1889.", "position": 2},
    ],
}  # fmt: skip
BRAVE_OK = {
    "type": "search",
    "query": {"original": "eiffel tower height"},
    "web": {
        "type": "search",
        "results": [
            {"title": "Eiffel Tower", "url": "https://example.org/eiffel",
             "description": "The <strong>Eiffel Tower</strong> is 330&nbsp;m tall.", "language": "en"},
        ],
    },
}  # fmt: skip


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: str | None = None


@dataclass
class FakeProvider:
    """A scripted provider: each request to a path takes the next reply (the last one repeats)."""

    url: str = ""
    script: dict[str, list[Reply]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self, path: str) -> Reply:
        with self.lock:
            replies = self.script.get(path) or [Reply(404, {"message": "no route"})]
            return replies.pop(0) if len(replies) > 1 else replies[0]


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            parsed = urlparse(self.path)
            fake.requests.append(
                {"method": self.command, "path": parsed.path, "query": parse_qs(parsed.query),
                 "headers": dict(self.headers), "json": json.loads(body) if body else None}
            )  # fmt: skip
            reply = fake.next_reply(parsed.path)
            data = (reply.raw if reply.raw is not None else json.dumps(reply.body)).encode()
            self.send_response(reply.status)
            content_type = "text/html" if parsed.path.startswith("/page") else "application/json"
            self.send_header("content-type", content_type)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def api_keys(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    monkeypatch.setenv("BRAVE_API_KEY", KEY)


def web(provider: FakeProvider, name: str = "serper", **kw: Any) -> WebBackend:
    cfg = WebSearchConfig(provider=name, endpoint=f"{provider.url}/{name}", requests_per_s=0, **kw)
    return WebBackend(cfg, default_topk=2)


def run(backend, queries, topk=None):
    return asyncio.run(backend.search(queries, topk))


def test_serper_sends_its_request_and_reads_organic_results(provider):
    provider.script["/serper"] = [Reply(body=SERPER_OK)]
    backend = web(provider)
    [passages] = run(backend, ["eiffel tower height"])
    assert [(p.id, p.title, p.text) for p in passages] == [
        ("https://en.wikipedia.org/wiki/Eiffel_Tower", "Eiffel Tower - Wikipedia", "The tower is 330 metres tall."),
        ("https://example.org/facts", "Facts", "Built in 1889."),
    ]
    req = provider.requests[0]
    assert req["method"] == "POST" and req["headers"]["X-API-KEY"] == KEY
    assert req["json"] == {"q": "eiffel tower height", "num": 2, "gl": "us", "hl": "en"}
    assert backend.meter.calls == 1 and backend.meter.cost_usd == pytest.approx(0.001)


def test_brave_sends_its_request_and_strips_highlights(provider):
    provider.script["/brave"] = [Reply(body=BRAVE_OK), Reply(body={"type": "search", "query": {"original": "zz"}})]
    backend = web(provider, "brave")
    [passages] = run(backend, ["eiffel tower height"], topk=5)
    assert [(p.id, p.text) for p in passages] == [("https://example.org/eiffel", "The Eiffel Tower is 330 m tall.")]
    req = provider.requests[0]
    assert req["method"] == "GET" and req["headers"]["X-Subscription-Token"] == KEY
    assert req["query"]["q"] == ["eiffel tower height"] and req["query"]["count"] == ["5"]
    assert run(backend, ["zz"]) == [[]]  # no "web" section: nothing matched, not an error


def test_429_waits_for_the_providers_reset_and_5xx_backs_off(provider, caplog):
    provider.script["/brave"] = [
        Reply(429, {"type": "ErrorResponse"}, {"X-RateLimit-Reset": "0.4, 2000000"}),
        Reply(503, {"error": "busy"}),
        Reply(body=BRAVE_OK),
    ]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        [passages] = run(web(provider, "brave"), ["q"])
    assert len(passages) == 1 and len(provider.requests) == 3
    assert time.monotonic() - start >= 0.4 + 0.25  # the reset, then the first backoff
    assert "HTTP 429" in caplog.text and "HTTP 503" in caplog.text and KEY not in caplog.text


def test_a_wait_past_the_retry_window_fails_at_once(provider):
    provider.script["/serper"] = [Reply(429, {"message": "Too many requests"}, {"Retry-After": "3600"})]
    start = time.monotonic()
    with pytest.raises(RetrieverError, match="retry_window_s"):
        run(web(provider, retry_window_s=5), ["q"])
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    "reply",
    [Reply(raw="<html>gateway</html>"), Reply(body={"organic": {"title": "x"}}), Reply(body=[1, 2]),
     Reply(body={"organic": [{"title": "no link"}]})],
    ids=["not-json", "organic-not-a-list", "not-an-object", "result-without-link"],
)  # fmt: skip
def test_malformed_answers_are_retriever_errors(provider, reply):
    provider.script["/serper"] = [reply]
    backend = web(provider)
    with pytest.raises(RetrieverError, match="malformed answer"):
        run(backend, ["q"])
    assert backend.meter.calls == 0  # an unusable answer is not counted as a paid call


@pytest.mark.parametrize(
    "reply",
    [Reply(raw="{truncated"), Reply(body={"web": [1]}), Reply(body={"web": {"results": "none"}}),
     Reply(body={"web": {"results": [{"title": "no url"}]}}), Reply(502, raw="Bad Gateway")],
    ids=["not-json", "web-not-an-object", "results-not-a-list", "result-without-url", "502-until-the-window-ends"],
)  # fmt: skip
def test_brave_failures_are_retriever_errors(provider, reply):
    provider.script["/brave"] = [reply]
    with pytest.raises(RetrieverError, match="malformed answer|retry_window_s"):
        run(web(provider, "brave", retry_window_s=0.5), ["q"])


def test_empty_results_are_empty_passage_lists(provider):
    provider.script["/serper"] = [Reply(body={"searchParameters": {"q": "zzqx"}, "organic": []})]
    assert run(web(provider), ["zzqx"]) == [[]]


def test_the_key_never_reaches_an_error_or_a_log(provider, caplog):
    provider.script["/serper"] = [Reply(401, {"message": f"Unauthorized: key {KEY} is invalid"})]
    backend = web(provider)
    with caplog.at_level(logging.DEBUG), pytest.raises(RetrieverError) as err:
        run(backend, ["q"])
    assert "$SERPER_API_KEY" in str(err.value) and "***" in str(err.value)
    assert KEY not in str(err.value) and KEY not in caplog.text and KEY not in repr(backend)
    assert KEY not in json.dumps(dict(backend.fingerprint()))


def test_a_missing_key_names_the_variable(monkeypatch, provider):
    monkeypatch.delenv("BRAVE_API_KEY")
    with pytest.raises(ValueError, match=r"\$BRAVE_API_KEY"):
        web(provider, "brave")


def test_page_text_replaces_the_snippet(provider):
    link = f"{provider.url}/page/eiffel"
    provider.script["/serper"] = [Reply(body={"organic": [{"title": "E", "link": link, "snippet": "short"}]})]
    page = "<html><head><script>var x;</script></head><body><p>The Eiffel Tower</p><p>is 330 m tall.</p></body></html>"
    provider.script["/page/eiffel"] = [Reply(raw=page)]
    [passages] = run(web(provider, passages="page", page_chars=20), ["q"])
    assert passages[0].text == "The Eiffel Tower is "


def test_a_spent_budget_stops_the_run_and_keeps_every_paid_answer(provider, tmp_path):
    provider.script["/serper"] = [Reply(body=SERPER_OK)]
    path = tmp_path / "web.sqlite"

    def cfg(max_calls: int) -> RetrieverClientConfig:
        return RetrieverClientConfig(
            backend="web",
            topk=2,
            web=WebSearchConfig(endpoint=f"{provider.url}/serper", requests_per_s=0, max_calls=max_calls),
            recording=RecordingConfig(mode="cache", path=str(path)),
        )

    retriever = build_retriever(cfg(2))
    with pytest.raises(SearchBudgetExhausted, match="retriever.web.max_calls=2") as err:
        run(retriever, ["q1", "q2", "q3"])
    assert not isinstance(err.value, RetrieverError)  # rollout.on_retriever_error=observe cannot swallow it
    assert len(provider.requests) == 2 and retriever.meter.calls == 2
    # the two paid answers are in the recording: a resumed run with one more call in its budget finishes
    resumed = build_retriever(cfg(1))
    assert len(run(resumed, ["q1", "q2", "q3"])) == 3
    assert len(provider.requests) == 3 and resumed.meter.totals() == (1, pytest.approx(0.001), 2)


@pytest.mark.slow
def test_main_eval_stops_with_one_line_when_the_budget_is_spent(provider, tmp_path):
    provider.script["/serper"] = [Reply(body=SERPER_OK)]
    cmd = [
        sys.executable, "-m", "search_rl.main_eval", "model=tiny", "data.max_samples=2",
        "retriever.backend=web", f"retriever.web.endpoint={provider.url}/serper", "retriever.web.max_calls=0",
        "retriever.recording.mode=cache", f"retriever.recording.path={tmp_path / 'web.sqlite'}",
        f"output_dir={tmp_path}",
    ]  # fmt: skip
    env = {**os.environ, "SERPER_API_KEY": KEY, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-2000:]
    assert "cannot evaluate: web search budget spent: 0 calls" in out and "Traceback" not in out
    assert KEY not in out and not provider.requests  # nothing was sent, nothing was paid
