"""The demo's retriever: a ``python -m retriever_server`` child process started with its build progress shown and
stopped whatever happens (``started``), a port to start it on, and ``--serve-only`` (start, query, serve)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from retriever_server.launcher import RetrieverProcess, free_port
from retriever_server.passages import split_contents
from search_rl.demo.progress import BuildProgress

logger = logging.getLogger(__name__)

DEMO_QUERIES = [
    "who got the first nobel prize in physics",
    "when was the last time anyone was on the moon",
    "What science fantasy young adult series, told in first person, has companion books about enslaved worlds?",
]


@contextmanager
def started(server: RetrieverProcess) -> Iterator[RetrieverProcess]:
    """Start the retriever, showing its build progress until it is ready; stop it on exit, whatever happens."""
    try:
        with BuildProgress(server.url):
            server.start()
        yield server
    finally:
        server.stop()


def start_port(requested: int) -> int:
    """``requested`` when nothing answers there, else a free port (another retriever may be serving)."""
    try:
        httpx.get(f"http://127.0.0.1:{requested}/health", timeout=1)
    except httpx.TransportError:
        return requested
    port = free_port()
    logger.info("port %d is taken; using %d", requested, port)
    return port


def show(url: str, queries: list[str], topk: int) -> None:
    """Query the server and log the top passages per query."""
    r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True}, timeout=60)
    r.raise_for_status()
    for query, hits in zip(queries, r.json()["result"], strict=True):
        logger.info("Q: %s", query)
        for rank, hit in enumerate(hits, start=1):
            title, text = split_contents(hit["document"]["contents"])
            logger.info("  %d. [%.3f] %s  %s", rank, hit["score"], title, text[:110].replace("\n", " ") + "...")


def serve(port: int, topk: int, keep_serving: bool) -> int:
    """``--serve-only``: start the retriever, query it, and serve until Ctrl-C (or stop at once)."""
    with started(RetrieverProcess(port=port, ready_timeout_s=3600)) as server:
        show(server.url, DEMO_QUERIES, topk)
        if not keep_serving:
            return 0
        logger.info("serving on %s (POST /retrieve, GET /health, GET /metrics); Ctrl-C to stop", server.url)
        try:
            while server.process is not None and server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            logger.info("stopping")
    return 0
