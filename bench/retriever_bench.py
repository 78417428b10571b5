"""Retriever throughput: the HTTP server under concurrent clients vs the same retriever called in-process.

Each client sends requests of ``--queries-per-request`` distinct questions (real NQ / HotpotQA questions, never
repeated within a run) back to back; we report queries/s and request latency p50/p99 at each concurrency, then
the in-process limit (the retriever's ``search`` on batches of ``--inprocess-batch`` queries, no HTTP). The
server's cache-hit counter is read from /metrics before and after, so an "uncached" figure is checked, not assumed.

    python bench/retriever_bench.py                     # starts its own server (cache off) on the shipped corpus
    python bench/retriever_bench.py --url http://127.0.0.1:8000   # against a running server

Last line: ``retriever_bench qps_c32=<x> inprocess_qps=<y> ratio=<x/y>``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import statistics
import time
from pathlib import Path

import httpx

from retriever_server.index.build import load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import Settings

SHIPPED_SPLITS = [
    Path(__file__).resolve().parents[1] / "data" / "datasets" / "nq_hotpotqa_mini" / f"{s}.parquet"
    for s in ("train", "val", "test")
]
"""Default question source: the shipped splits (2,355 NQ + 500 HotpotQA questions)."""


def load_questions(seed: int, kind: str = "nq", raw: Path | None = None) -> list[str]:
    """Distinct real questions, shuffled: NQ (short, like Search-R1's NQ rollouts) or NQ + HotpotQA (mixed). From the
    shipped splits by default; ``raw`` (a folder with a maintainer's raw snapshot) gives the larger
    NQ-open sets used for the figures recorded before 2026-11-23."""
    qs: list[str] = []
    if raw is None:
        import pandas as pd

        for path in SHIPPED_SPLITS:
            rows = pd.read_parquet(path, columns=["data_source", "question"])
            qs += [
                q
                for q, src in zip(rows["question"], rows["data_source"], strict=True)
                if kind == "mixed" or src == "nq"
            ]
    else:
        nq = raw / "google-research-datasets__natural-questions"
        for name in ("NQ-open.dev.jsonl", "NQ-open.efficientqa.dev.1.1.jsonl", "NQ-open.efficientqa.test.1.1.jsonl"):
            with open(nq / name) as f:
                qs += [json.loads(line)["question"] for line in f]
        with gzip.open(raw / "nelson-liu__lost-in-the-middle" / "nq-open-oracle.jsonl.gz", "rt") as f:
            qs += [json.loads(line)["question"] for line in f]
        if kind == "mixed":
            hotpot = json.loads((raw / "ysymyth__ReAct" / "hotpot_dev_v1_simplified.json").read_text())
            qs += [r["question"] for r in hotpot]
    unique = sorted(set(q.strip() for q in qs if q.strip()))
    random.Random(seed).shuffle(unique)
    return unique


def enough(questions: list[str], n: int) -> list[str]:
    """``n`` questions: the distinct ones, repeated in order when more are needed (the bench's own server runs with
    its cache off, so a repeat costs what a new question costs; against ``--url`` a cache would see repeats)."""
    if n > len(questions):
        print(f"note: {n} questions needed, {len(questions)} distinct; repeating them (pass --raw for more)")
    return [questions[i % len(questions)] for i in range(n)]


def cache_hits(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("retriever_cache_hits_total"):
            return float(line.split()[-1])
    return 0.0


async def run_level(
    url: str, questions: list[str], clients: int, requests_each: int, per_request: int, warmup_rounds: int
) -> dict:
    """``clients`` closed-loop clients, each sending ``requests_each`` requests back to back.

    The load generator is aiohttp: it costs the shared CPU about half what httpx does, and on a 2-core machine
    every cycle the client spends is a cycle the server does not get.
    """
    import aiohttp

    latencies: list[float] = []
    chunks = [questions[i : i + per_request] for i in range(0, clients * requests_each * per_request, per_request)]

    async def client(c: int, http: aiohttp.ClientSession) -> None:
        for r in range(requests_each):
            body = {"queries": chunks[c * requests_each + r], "topk": 3, "return_scores": True}
            t0 = time.perf_counter()
            async with http.post(f"{url}/retrieve", json=body) as resp:
                await resp.read()
                resp.raise_for_status()
            latencies.append(time.perf_counter() - t0)

    async def warm_up(c: int, http: aiohttp.ClientSession) -> None:
        # Opens this client's connection and lets the batcher settle into the steady state before timing: the
        # first rounds after 32 clients start in lockstep are split unevenly into batches (see bench/README.md).
        for r in range(warmup_rounds):
            body = {"queries": [f"warm up {c} {r} {j}" for j in range(per_request)], "topk": 3, "return_scores": True}
            async with http.post(f"{url}/retrieve", json=body) as resp:
                resp.raise_for_status()

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        await asyncio.gather(*(warm_up(c, http) for c in range(clients)))
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        wall = time.perf_counter() - t0
    lat = sorted(latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]

    return {
        "clients": clients,
        "qps": len(lat) * per_request / wall,
        "p50_s": statistics.median(lat),
        "p90_s": pct(0.90),
        "p99_s": pct(0.99),
        "requests": len(lat),
    }


def inprocess_qps(settings: Settings, questions: list[str], batch: int) -> float:
    retriever = load_retriever(load_corpus(settings.corpus_path), settings)
    retriever.search(questions[:batch], 3)  # warm up
    t0 = time.perf_counter()
    n = 0
    for start in range(0, len(questions) - batch + 1, batch):
        retriever.search(questions[start : start + batch], 3)
        n += batch
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="running server; default: start one (RETRIEVER_* env applies, cache off)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--queries-per-request", type=int, default=4)
    ap.add_argument(
        "--requests-per-client",
        type=int,
        nargs="+",
        default=None,
        help="per concurrency level (one value, or one per level); default 60 / 30 / 24 at c = 1 / 8 / 32, else 24",
    )
    ap.add_argument("--warmup-rounds", type=int, default=3, help="untimed requests per client before each level")
    ap.add_argument("--inprocess-batch", type=int, default=128)
    ap.add_argument("--inprocess-queries", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--questions", choices=["nq", "mixed"], default="nq", help="nq, or nq + HotpotQA (longer)")
    ap.add_argument("--raw", type=Path, default=None, help="a raw data snapshot for more questions (maintainers)")
    args = ap.parse_args()

    each = args.requests_per_client or [{1: 60, 8: 30}.get(c, 24) for c in args.concurrency]
    per_level = each * len(args.concurrency) if len(each) == 1 else each
    if len(per_level) != len(args.concurrency):
        ap.error(f"--requests-per-client: {len(each)} values for {len(args.concurrency)} concurrency levels")
    total = sum(c * r * args.queries_per_request for c, r in zip(args.concurrency, per_level, strict=True))
    questions = enough(load_questions(args.seed, args.questions, args.raw), total + args.inprocess_queries)
    server = None
    if args.url is None:
        server = RetrieverProcess(env={"RETRIEVER_CACHE_SIZE": "0"}, ready_timeout_s=1800)
        server.start()
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        health = httpx.get(f"{url}/health").json()
        print(f"server {url}: {health}")
        hits_before = cache_hits(url)
        offset, results = 0, []
        for clients, each in zip(args.concurrency, per_level, strict=True):
            need = clients * each * args.queries_per_request
            res = asyncio.run(
                run_level(
                    url, questions[offset : offset + need], clients, each, args.queries_per_request, args.warmup_rounds
                )
            )
            offset += need
            results.append(res)
            print(
                f"c={clients:>3}  {res['qps']:7.1f} queries/s  p50={res['p50_s'] * 1000:6.1f} ms  "
                f"p90={res['p90_s'] * 1000:6.1f} ms  p99={res['p99_s'] * 1000:6.1f} ms"
            )
        print(f"server cache hits during the run: {cache_hits(url) - hits_before:.0f}")
    finally:
        if server is not None:
            server.stop()

    settings = Settings(show_progress=False)
    rest = questions[offset : offset + args.inprocess_queries]
    limit = inprocess_qps(settings, rest, args.inprocess_batch)
    print(f"in-process {settings.method.value} search, batch {args.inprocess_batch}: {limit:.1f} queries/s")
    top = results[-1]
    print(
        f"retriever_bench qps_c{top['clients']}={top['qps']:.1f} inprocess_qps={limit:.1f} "
        f"ratio={top['qps'] / limit:.2f}"
    )


if __name__ == "__main__":
    main()
