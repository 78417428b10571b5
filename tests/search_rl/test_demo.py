"""The demo's retriever lifecycle: it serves, and it stops the server it started when the run fails or on Ctrl-C.

The full journey (train, evaluate, plots, viewer command) runs in ``tests/test_readme.py`` (slow).

Run: python -m pytest tests/search_rl/test_demo.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from retriever_server.launcher import free_port
from search_rl import demo


@pytest.fixture
def bm25(monkeypatch):
    """The demo's child server uses BM25 (its index is built in seconds and cached)."""
    monkeypatch.setenv("RETRIEVER_METHOD", "bm25")
    monkeypatch.setenv("RETRIEVER_SHOW_PROGRESS", "false")


def _down(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.integration
def test_serve_only_exit(bm25, caplog):
    port = free_port()
    caplog.set_level("INFO", logger="search_rl.demo")
    assert demo.main(["--serve-only", "--exit", "--port", str(port)]) == 0
    assert "Q: who got the first nobel prize in physics" in caplog.text
    assert _down(port)


@pytest.mark.integration
def test_failed_run_stops_the_retriever(bm25, tmp_path):
    port = free_port()
    with pytest.raises(ValueError, match="max_turns"):  # a real config error, raised after the server is up
        demo.main(["--model", "tiny", "--max-turns", "-1", "--port", str(port), "--run-dir", str(tmp_path)])
    assert (tmp_path / "retriever.log").exists()
    assert _down(port)


@pytest.mark.integration
def test_ctrl_c_stops_the_retriever(tmp_path):
    """SIGINT while training starts: exit code 130, and the retriever the demo started is gone."""
    port = free_port()
    env = {**os.environ, "RETRIEVER_METHOD": "bm25", "RETRIEVER_SHOW_PROGRESS": "false"}
    argv = [sys.executable, "-m", "search_rl.demo", "--model", "tiny", "--port", str(port), "--run-dir", str(tmp_path)]
    log = open(tmp_path / "demo.log", "w")  # noqa: SIM115 (closed below); a pipe nobody reads could fill and block
    # A shell that runs a job in the background (as CI may) starts it with SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored; give the demo the default disposition a terminal user has.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 300
        while _down(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the retriever the demo starts is up once its port answers
        assert proc.poll() is None, f"demo exited early ({proc.returncode}) before the retriever was up"
        assert not _down(port)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        proc.kill()
        log.close()
    assert _down(port)
