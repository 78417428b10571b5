"""The demo shows the retriever's index build while it waits: ``search_rl.demo.progress.BuildProgress`` polls
``GET /health`` of a real server that encodes a small corpus, logs each step and draws a bar of the passages encoded.

Run: python -m pytest tests/search_rl/test_demo_progress.py -q
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.demo.progress import BuildProgress

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_build_progress_follows_the_encoding(tmp_path: Path, caplog, capsys) -> None:
    n = 48
    with gzip.open(SHIPPED_CORPUS, "rt", encoding="utf-8") as f:
        rows = [json.loads(next(f)) for _ in range(n)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    env = {
        "RETRIEVER_METHOD": "dense",
        "RETRIEVER_CORPUS_PATH": str(corpus),
        "RETRIEVER_INDEX_DIR": str(tmp_path / "idx"),
        "RETRIEVER_ENCODE_BATCH_SIZE": "4",
    }
    server = RetrieverProcess(env=env, ready_timeout_s=600, log_path=tmp_path / "server.log")
    try:
        with caplog.at_level(logging.INFO, logger="search_rl.demo"), BuildProgress(server.url, 0.1) as progress:
            server.start()
    finally:
        server.stop()
    encoding = [p for p in progress.seen if p["stage"] == "encoding corpus"]
    assert len(encoding) >= 2 and all(p["total"] == n for p in encoding)
    assert [p["done"] for p in encoding] == sorted(p["done"] for p in encoding)
    assert caplog.text.count("retriever: encoding corpus") == 1  # one line per step, however many reports
    assert "encoding corpus:" in capsys.readouterr().err  # the tqdm bar
