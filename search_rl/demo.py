"""The README's first command (``make demo``): start the retriever on the shipped corpus, query it, keep serving.

The first start builds the dense index (minutes on a laptop CPU, with a progress bar) and caches it; later starts
load it in seconds. ``--exit`` stops the server after the queries instead of serving until Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import httpx

from retriever_server.launcher import RetrieverProcess, free_port
from retriever_server.settings import get_settings

logger = logging.getLogger("search_rl.demo")

DEMO_QUERIES = [
    "who got the first nobel prize in physics",
    "when was the last time anyone was on the moon",
    "What science fantasy young adult series, told in first person, has companion books about enslaved worlds?",
]


def show(url: str, queries: list[str], topk: int) -> None:
    """Query the server and log the top passages per query."""
    r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True}, timeout=60)
    r.raise_for_status()
    for query, hits in zip(queries, r.json()["result"], strict=True):
        logger.info("Q: %s", query)
        for rank, hit in enumerate(hits, start=1):
            title, _, text = hit["document"]["contents"].partition("\n")
            logger.info("  %d. [%.3f] %s  %s", rank, hit["score"], title, text[:110].replace("\n", " ") + "...")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8000, help="port to serve on (a free one if taken)")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--exit", action="store_true", help="stop the server after the demo queries")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health poll is noise here
    settings = get_settings()
    port = args.port
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        port = free_port()
        logger.info("port %d is taken; using %d", args.port, port)
    except httpx.TransportError:
        pass
    logger.info("starting the retriever (%s over %s); the first start builds and caches the index ...",
                settings.method.value, settings.corpus_path)
    t0 = time.perf_counter()
    with RetrieverProcess(port=port, ready_timeout_s=3600) as server:
        logger.info("ready in %.0fs at %s", time.perf_counter() - t0, server.url)
        show(server.url, DEMO_QUERIES, args.topk)
        if args.exit:
            return 0
        logger.info("\nserving on %s (POST /retrieve, GET /health, GET /metrics); Ctrl-C to stop", server.url)
        try:
            while server.process is not None and server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            logger.info("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
