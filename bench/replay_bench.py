"""Replay throughput: the same questions answered by the live dense retriever and by a retrieval recording.

Starts the default dense retriever (MiniLM + FAISS over the shipped corpus, server cache off), sends ``--questions``
distinct NQ questions in batches of ``--batch`` (one rollout turn's searches) through ``retriever.backend=http`` with
``retriever.recording.mode=record`` (the live figure includes writing the recording), then answers the same batches
with ``retriever.backend=replay`` from that file, and checks that every replayed answer equals the live one.

    python bench/replay_bench.py                       # 1000 questions, batches of 32
    python bench/replay_bench.py --url http://127.0.0.1:8000   # against a running dense server (its cache counts)

Last line: ``replay_bench live_qps=<x> replay_qps=<y> speedup=<y/x> identical=<true|false>``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import SHIPPED_CORPUS, default_cache_dir
from search_rl.config import RetrieverClientConfig
from search_rl.config.search_backends import RecordingConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends import build_retriever

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retriever_bench import load_questions  # noqa: E402  (a sibling script, not a package)

logger = logging.getLogger("replay_bench")


def timed_search(cfg: RetrieverClientConfig, batches: list[list[str]]) -> tuple[float, list[list[Passage]]]:
    """Seconds to answer every batch in order with the backend of ``cfg``, and the answers."""
    retriever = build_retriever(cfg)

    async def run() -> list[list[Passage]]:
        out: list[list[Passage]] = []
        for batch in batches:
            out += await retriever.search(batch)
        return out

    start = time.perf_counter()
    answers = asyncio.run(run())
    return time.perf_counter() - start, answers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running retriever (default: start a dense one, cache off)")
    ap.add_argument("--questions", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    questions = load_questions(args.seed)[: args.questions]
    batches = [questions[i : i + args.batch] for i in range(0, len(questions), args.batch)]
    env = {
        "RETRIEVER_METHOD": "dense",
        "RETRIEVER_CORPUS_PATH": str(SHIPPED_CORPUS),
        "RETRIEVER_INDEX_DIR": str(default_cache_dir() / "indexes"),
        "RETRIEVER_CACHE_SIZE": "0",
    }
    server = nullcontext() if args.url else RetrieverProcess(env=env, ready_timeout_s=1500)
    with tempfile.TemporaryDirectory() as tmp, server as proc:
        url = args.url or proc.url  # type: ignore[union-attr]
        rec = RecordingConfig(mode="record", path=str(Path(tmp) / "bench.sqlite"))
        live_s, live = timed_search(RetrieverClientConfig(url=url, topk=args.topk, recording=rec), batches)
        replay = RecordingConfig(path=rec.path)
        cfg = RetrieverClientConfig(backend="replay", url=url, topk=args.topk, recording=replay)
        replay_s, replayed = timed_search(cfg, batches)
        size_mb = Path(rec.path).stat().st_size / 1e6  # type: ignore[arg-type]
    n = len(questions)
    live_qps, replay_qps = n / live_s, n / replay_s
    logger.info("%d questions in batches of %d, top-%d; recording %.1f MB", n, args.batch, args.topk, size_mb)
    logger.info("live retriever (recording): %.2f s, %.1f q/s", live_s, live_qps)
    logger.info("replay from the file:   %.2f s, %.1f q/s", replay_s, replay_qps)
    identical = live == replayed
    sys.stdout.write(
        f"replay_bench live_qps={live_qps:.1f} replay_qps={replay_qps:.1f} speedup={replay_qps / live_qps:.1f} "
        f"identical={str(identical).lower()}\n"
    )
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
