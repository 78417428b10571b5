"""``GET /health`` reports the index build while the server loads: the step, items done of total, seconds elapsed.

A real uvicorn server builds a dense index over a small corpus that has no shipped embeddings, so it encodes.
Run: python -m pytest tests/retriever_server/api/test_health_progress.py -q
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from retriever_server.launcher import RetrieverProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_health_reports_encoding_progress_until_ready(tmp_path: Path, make_corpus: Callable[[int], Path]) -> None:
    n = 48
    env = {
        "RETRIEVER_METHOD": "dense",
        "RETRIEVER_CORPUS_PATH": str(make_corpus(n)),
        "RETRIEVER_INDEX_DIR": str(tmp_path / "idx"),
        "RETRIEVER_ENCODE_BATCH_SIZE": "4",  # a progress report every 4 passages
    }
    server = RetrieverProcess(env=env, ready_timeout_s=600, log_path=tmp_path / "server.log")
    starter = threading.Thread(target=server.start, daemon=True)
    starter.start()
    bodies = []
    try:
        with httpx.Client(timeout=5) as client:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    r = client.get(f"{server.url}/health")
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                bodies.append((r.status_code, r.json()))
                if r.status_code == 200 or r.json()["status"] == "failed":
                    break
                time.sleep(0.1)
        starter.join(60)
    finally:
        server.stop()
    assert bodies and bodies[-1][0] == 200 and bodies[-1][1]["progress"] is None, bodies[-1]
    loading = [b["progress"] for code, b in bodies if code == 503 and b["status"] == "loading" and b["progress"]]
    encoding = [p for p in loading if p["stage"] == "encoding corpus"]
    assert encoding, f"no encoding progress among {loading}"
    assert all(p["total"] == n and 0 <= p["done"] <= n for p in encoding)
    done = [p["done"] for p in encoding]
    assert done == sorted(done) and len(set(done)) >= 2, done  # it moves while the client waits
    elapsed = [p["elapsed_s"] for p in loading]
    assert elapsed == sorted(elapsed)
