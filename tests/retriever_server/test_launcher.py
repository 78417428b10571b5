"""Starting the service as users do, and how failures surface:
``python -m pytest tests/retriever_server/test_launcher.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from retriever_server.launcher import RetrieverProcess, wait_until_ready

pytestmark = pytest.mark.integration


def test_missing_corpus_is_reported_by_health_and_launcher(tmp_path: Path) -> None:
    env = {"RETRIEVER_CORPUS_PATH": str(tmp_path / "nope.jsonl"), "RETRIEVER_METHOD": "bm25"}
    server = RetrieverProcess(env=env, ready_timeout_s=60, log_path=tmp_path / "log.txt")
    with pytest.raises(
        RuntimeError, match=r"failed to load its index: FileNotFoundError: corpus file not found: .*nope\.jsonl"
    ):
        server.start()
    assert server.process is not None and server.process.poll() is not None  # stopped, no orphan


def test_failed_server_keeps_answering_health_and_refuses_search(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "ok"}\n{"id": "1", "contents": "dup"}\n')
    env = {"RETRIEVER_CORPUS_PATH": str(bad), "RETRIEVER_METHOD": "bm25"}
    server = RetrieverProcess(env=env, ready_timeout_s=60)
    server.process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "retriever_server.app:app", "--port", str(server.port)],
        env=server.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with pytest.raises(RuntimeError, match="duplicate id '1'"):
            wait_until_ready(server.url, 60, server.process)
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        r = httpx.post(f"{server.url}/retrieve", json={"queries": ["x"]})
        assert r.status_code == 503 and "failed to load" in r.json()["detail"]
    finally:
        server.stop()


def test_build_index_cli_builds_what_the_server_then_loads(tmp_path: Path, small_corpus: Path) -> None:
    out = tmp_path / "indexes"
    cmd = [
        sys.executable,
        "-m",
        "retriever_server.index.build",
        "--corpus",
        str(small_corpus),
        "--method",
        "bm25",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "serve it with: RETRIEVER_INDEX_DIR=" in done.stderr
    folders = [p for p in out.iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / "meta.json").exists()
    env = {"RETRIEVER_CORPUS_PATH": str(small_corpus), "RETRIEVER_METHOD": "bm25", "RETRIEVER_INDEX_DIR": str(out)}
    with RetrieverProcess(env=env, ready_timeout_s=60) as server:
        health = httpx.get(f"{server.url}/health").json()
    assert health["index_path"] == folders[0].name  # reused, not rebuilt elsewhere


def test_build_index_cli_rejects_a_bad_method(tmp_path: Path, small_corpus: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "retriever_server.index.build",
        "--corpus",
        str(small_corpus),
        "--method",
        "splade",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'splade'" in done.stderr


def test_a_server_that_exits_at_start_names_its_log_lines(tmp_path: Path) -> None:
    server = RetrieverProcess(env={"RETRIEVER_METHOD": "nope"}, ready_timeout_s=60, log_path=tmp_path / "log.txt")
    with pytest.raises(
        RuntimeError, match=r"(?s)exited with code 1 before it was ready; last lines of .*log\.txt.*nope"
    ):
        server.start()
