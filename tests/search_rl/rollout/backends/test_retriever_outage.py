"""The retriever client through an outage (issue 16, items 6 and 7): a restart inside the retry window, a window
that runs out, the real URL in every hint, a hung server's timeout, and a start-up check that searches for real.

Servers are real: ``python -m retriever_server`` (BM25 over the shipped corpus) on a free loopback port, and, for
the hung server, a real socket that accepts connections and never answers.

Run: python -m pytest tests/search_rl/rollout/backends/test_retriever_outage.py -q   (about 40 s)
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from retriever_server.launcher import RetrieverProcess, bm25_env, free_port
from search_rl.config import RetrieverClientConfig
from search_rl.configure import load_config
from search_rl.main_ppo import prepare
from search_rl.rollout.backends import RetrieverClient, RetrieverError

RESTART_PAUSE_S = 5.0
"""How long the server stays down before it is started again (the old client gave up after 3.5 s)."""


@pytest.fixture(scope="module")
def server_env(tmp_path_factory) -> dict[str, str]:
    return bm25_env(tmp_path_factory.mktemp("bm25-outage"))


@pytest.mark.integration
@pytest.mark.slow
def test_default_retry_window_outlasts_a_restart(server_env, tmp_path):
    server = RetrieverProcess(env=server_env, port=free_port(), ready_timeout_s=180, log_path=tmp_path / "server.log")
    server.start()
    try:
        client = RetrieverClient(RetrieverClientConfig(url=server.url))  # the defaults, as a training run has them
        assert asyncio.run(client.search(["Deadpool 2"]))[0]
        server.stop()
        restarted = threading.Event()

        def restart() -> None:
            time.sleep(RESTART_PAUSE_S)
            server.start()
            restarted.set()

        restarter = threading.Thread(target=restart, daemon=True)
        restarter.start()
        start = time.monotonic()
        try:
            results = asyncio.run(client.search(["Deadpool 2", "Nobel Prize"]))
        finally:
            elapsed = time.monotonic() - start
            restarter.join()  # so that a failed search does not leave the restarted server running
    finally:
        server.stop()
    assert restarted.is_set() and elapsed > RESTART_PAUSE_S
    assert any("Deadpool" in p.title for p in results[0]) and client.retries >= 3 and client.failures == 0


def test_retry_window_runs_out_naming_the_real_url_and_port():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = RetrieverClient(RetrieverClientConfig(url=url, retry_window_s=1.5, backoff_s=0.2, backoff_max_s=0.4))
    start = time.monotonic()
    with pytest.raises(RetrieverError) as info:
        asyncio.run(client.search(["q"]))
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert elapsed >= 1.5, "retries go on to the end of the window, not less"
    assert elapsed < 30, "and then stop (a generous bound: a loaded machine is slow, not endless)"
    assert "retriever.retry_window_s=1.5" in message and f"{url}/retrieve" in message
    assert f"--host 127.0.0.1 --port {port}`" in message and "--port 8000" not in message
    assert client.retries >= 3 and client.failures == 1


def test_hung_server_timeout_says_what_timed_out():
    async def scenario() -> RetrieverError:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RetrieverClient(RetrieverClientConfig(url=f"http://127.0.0.1:{port}", timeout_s=0.3, max_retries=0))
        try:
            await client.search(["q"])
        except RetrieverError as e:
            return e
        finally:
            server.close()
        raise AssertionError("no RetrieverError")

    message = str(asyncio.run(scenario()))
    assert "ReadTimeout: no answer within 0.3 s (retriever.timeout_s)" in message


@pytest.mark.integration
def test_start_up_check_searches_and_refuses_a_wrong_path(retriever_url):
    RetrieverClient(RetrieverClientConfig(url=retriever_url)).check_reachable()
    start = time.monotonic()
    with pytest.raises(RetrieverError) as info:
        RetrieverClient(RetrieverClientConfig(url=f"{retriever_url}/typo")).check_reachable()
    message = str(info.value)
    assert time.monotonic() - start < 60  # no retry window on a 404: answered at once, not waited out
    assert f"POST {retriever_url}/typo/retrieve answered HTTP 404" in message
    assert "answers at its root, not under /typo" in message


@pytest.mark.integration
def test_training_refuses_a_wrong_retriever_path_before_anything_starts(retriever_url, tmp_path):
    cfg = load_config(["model=tiny", f"retriever.url={retriever_url}/typo", f"trainer.default_local_dir={tmp_path}"])
    with pytest.raises(RetrieverError, match="cannot search"):
        prepare(cfg)
