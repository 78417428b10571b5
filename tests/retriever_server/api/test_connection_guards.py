"""Half-sent requests, allowed Host names and what ``/health`` reveals, against real servers
(``python -m retriever_server``, BM25 over 300 shipped passages): ``python -m pytest
tests/retriever_server/api/test_connection_guards.py``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from retriever_server.launcher import RetrieverProcess, bm25_env, wait_until_ready
from retriever_server.settings import SHIPPED_CORPUS

pytestmark = pytest.mark.integration

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def guarded_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with a 1 s request deadline that also answers to the name ``node-a.example``."""
    corpus = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    with gzip.open(SHIPPED_CORPUS, "rt", encoding="utf-8") as f:
        corpus.write_text("".join(line for line, _ in zip(f, range(300), strict=False)), encoding="utf-8")
    env = {
        **bm25_env(tmp_path_factory.mktemp("idx"), corpus),
        "RETRIEVER_REQUEST_TIMEOUT_S": str(TIMEOUT_S),
        "RETRIEVER_ALLOWED_HOSTS": "node-a.example, 10.9.8.7",
    }
    with RetrieverProcess(env=env, ready_timeout_s=120) as server:
        yield server.url


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def read_until_closed(sock: socket.socket, limit_s: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (seconds from now)."""
    t0, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - t0


def test_headers_sent_byte_by_byte_are_cut_off(guarded_url: str) -> None:
    """Slowloris: a header line every 0.2 s kept a connection open for ever (issue 16)."""
    sock = connect(guarded_url)
    t0 = time.monotonic()
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for i in range(50):
            time.sleep(0.2)
            sock.sendall(f"X-Slow-{i}: x\r\n".encode())
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed by the server while we were still sending
    data, _ = read_until_closed(sock)
    closed_after = time.monotonic() - t0
    assert closed_after < TIMEOUT_S + 3, closed_after
    assert data.startswith(b"HTTP/1.1 408"), data[:100]


def test_a_connection_that_sends_nothing_is_closed(guarded_url: str) -> None:
    data, closed_after = read_until_closed(connect(guarded_url))
    assert closed_after < TIMEOUT_S + 3 and data.startswith(b"HTTP/1.1 408")


def test_a_half_sent_body_gets_408(guarded_url: str) -> None:
    sock = connect(guarded_url)
    host = urlsplit(guarded_url).netloc
    head = f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    sock.sendall(head.encode() + b'{"queries": ["par')
    data, closed_after = read_until_closed(sock)
    assert closed_after < TIMEOUT_S + 3
    status, _, rest = data.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408") and b"RETRIEVER_REQUEST_TIMEOUT_S" in rest


def test_keep_alive_requests_within_the_deadline_still_work(guarded_url: str) -> None:
    with httpx.Client(base_url=guarded_url) as client:
        for _ in range(3):
            assert client.post("/retrieve", json={"queries": ["paris"]}).status_code == 200
            time.sleep(TIMEOUT_S * 0.6)  # idle between requests is the keep-alive timeout's business


@pytest.mark.parametrize(("host", "status"), [("node-a.example:8000", 200), ("10.9.8.7", 200), ("node-b.example", 400)])
def test_allowed_hosts_setting_admits_named_hosts(guarded_url: str, host: str, status: int) -> None:
    r = httpx.post(f"{guarded_url}/retrieve", json={"queries": ["paris"]}, headers={"host": host})
    assert r.status_code == status, r.text


@contextlib.contextmanager
def failed_server(env: dict[str, str]) -> Iterator[str]:
    """A server whose index fails to load, once its ``/health`` says so (the launcher would stop it)."""
    server = RetrieverProcess(env=env)
    cmd = [sys.executable, "-m", "retriever_server", "--host", server.host, "--port", str(server.port)]
    server.process = subprocess.Popen(cmd, env=server.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(RuntimeError, match="failed to load its index"):
            wait_until_ready(server.url, 60, server.process)
        yield server.url
    finally:
        server.stop()


def test_a_failed_load_is_reported_without_absolute_paths(tmp_path: Path) -> None:
    bad = tmp_path / "private-dir" / "corpus.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"id": "1", "contents": "a"}\n{"id": "1", "contents": "b"}\n')
    env = {"RETRIEVER_METHOD": "bm25", "RETRIEVER_CORPUS_PATH": str(bad), "RETRIEVER_INDEX_DIR": str(tmp_path / "i")}
    with failed_server(env) as url:
        body = httpx.get(f"{url}/health").json()
        refused = httpx.post(f"{url}/retrieve", json={"queries": ["x"]})
    assert body["status"] == "failed" and "corpus.jsonl:2: duplicate id '1'" in body["error"]
    assert str(tmp_path) not in json.dumps(body) and "private-dir" not in json.dumps(body)
    assert refused.status_code == 503 and "duplicate id" in refused.text and str(tmp_path) not in refused.text
