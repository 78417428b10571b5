"""The retriever under overload: a small request behind a maximum-size one, and a burst of requests.

1. Head of line. One maximum-size request (``--big-queries`` distinct passages of ``--big-chars`` characters of corpus
   text, top-``--big-topk`` with scores) and, ``--delay-s`` later, 1-query requests one after another until the big
   one is answered. Reports the big request's time and size and the small requests' latencies.
2. Burst. ``--burst`` requests of ``--burst-queries`` distinct questions each (the shipped train/test questions),
   all sent at once with the trainer client's 30 s timeout. Reports how many were answered (200), refused (503) or
   timed out, and the latencies of each kind.

    python bench/overload_bench.py --method bm25                 # starts its own server (cache off), shipped corpus
    python bench/overload_bench.py --url http://127.0.0.1:8000   # against a running server (turn its cache off)

Last line: ``overload_bench small_first_ms=<x> small_max_ms=<y> big_s=<z> burst_ok=<n> burst_503=<n>
burst_timeouts=<n> burst_ok_p50_s=<s>``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import random
import statistics
import time
from pathlib import Path

import httpx
import pandas as pd

from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import SHIPPED_CORPUS

REPO = Path(__file__).resolve().parents[1]
QUESTION_FILES = ["data/datasets/nq_hotpotqa_mini/train.parquet", "data/datasets/nq_hotpotqa_mini/test.parquet"]


def long_queries(n: int, chars: int) -> list[str]:
    """``n`` distinct slices of ``chars`` characters of the shipped corpus text."""
    text, out = "", []
    with gzip.open(SHIPPED_CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            text += json.loads(line)["contents"] + " "
            while len(text) >= chars and len(out) < n:
                out.append(text[:chars])
                text = text[chars:]
            if len(out) == n:
                return out
    raise ValueError(f"the corpus has fewer than {n} x {chars} characters")


def questions(seed: int) -> list[str]:
    qs = {q.strip() for f in QUESTION_FILES for q in pd.read_parquet(REPO / f)["question"] if q.strip()}
    out = sorted(qs)
    random.Random(seed).shuffle(out)
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


async def head_of_line(url: str, args: argparse.Namespace, probes: list[str]) -> dict:
    big = {"queries": long_queries(args.big_queries, args.big_chars), "topk": args.big_topk, "return_scores": True}
    small_ms: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=args.big_timeout_s) as client:
        t0 = time.perf_counter()
        big_task = asyncio.create_task(client.post("/retrieve", json=big))
        await asyncio.sleep(args.delay_s)
        for q in itertools.cycle(probes):
            if big_task.done():
                break
            t = time.perf_counter()
            r = await client.post("/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
            small_ms.append((time.perf_counter() - t) * 1000)
            if r.status_code != 200:
                raise RuntimeError(f"small request answered {r.status_code}: {r.text[:200]}")
        resp = await big_task
        big_s = time.perf_counter() - t0
    return {"big_status": resp.status_code, "big_s": big_s, "big_mb": len(resp.content) / 1e6, "small_ms": small_ms}


async def burst(url: str, args: argparse.Namespace, qs: list[str]) -> dict:
    n = args.burst_queries
    bodies = [
        {"queries": [qs[(i * n + j) % len(qs)] for j in range(n)], "topk": 3, "return_scores": True}
        for i in range(args.burst)
    ]
    limits = httpx.Limits(max_connections=args.burst)
    outcomes: list[tuple[str, float, str]] = []
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:

        async def one(body: dict) -> None:
            t = time.perf_counter()
            try:
                r = await client.post("/retrieve", json=body)
                kind, retry = str(r.status_code), r.headers.get("retry-after", "")
            except httpx.TimeoutException:
                kind, retry = "timeout", ""
            outcomes.append((kind, time.perf_counter() - t, retry))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
    by_kind: dict[str, list[float]] = {}
    for kind, s, _ in outcomes:
        by_kind.setdefault(kind, []).append(s)
    retry_after = sorted({int(r) for k, _, r in outcomes if k == "503" and r})
    return {"wall_s": wall, "by_kind": by_kind, "retry_after": retry_after}


def report(hol: dict, b: dict) -> None:
    small = hol["small_ms"]
    print(
        f"head of line: big request {hol['big_status']} in {hol['big_s']:.1f} s, {hol['big_mb']:.1f} MB; "
        f"{len(small)} small requests meanwhile: first {small[0]:.0f} ms, median {statistics.median(small):.0f} ms, "
        f"max {max(small):.0f} ms"
    )
    print(f"burst: wall {b['wall_s']:.1f} s; Retry-After values {b['retry_after']}")
    for kind, xs in sorted(b["by_kind"].items()):
        p50, p90 = pct(xs, 0.5), pct(xs, 0.9)
        print(f"  {kind}: {len(xs)} requests, latency p50 {p50:.2f} s, p90 {p90:.2f} s, max {max(xs):.2f} s")
    ok = b["by_kind"].get("200", [])
    print(
        f"overload_bench small_first_ms={small[0]:.0f} small_max_ms={max(small):.0f} big_s={hol['big_s']:.1f} "
        f"burst_ok={len(ok)} burst_503={len(b['by_kind'].get('503', []))} "
        f"burst_timeouts={len(b['by_kind'].get('timeout', []))} burst_ok_p50_s={pct(ok, 0.5):.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="a running server; default: start one on the shipped corpus")
    p.add_argument("--method", default="dense", choices=["dense", "bm25", "hybrid"], help="for the started server")
    p.add_argument("--big-queries", type=int, default=1024)
    p.add_argument("--big-chars", type=int, default=2048)
    p.add_argument("--big-topk", type=int, default=100)
    p.add_argument("--big-timeout-s", type=float, default=900.0)
    p.add_argument("--delay-s", type=float, default=1.0)
    p.add_argument("--burst", type=int, default=200)
    p.add_argument("--burst-queries", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    qs = questions(args.seed)  # ~2,800 questions, reused in turn: the server's cache must be off
    if args.url:
        hol = asyncio.run(head_of_line(args.url, args, qs))
        b = asyncio.run(burst(args.url, args, qs))
    else:
        env = {"RETRIEVER_METHOD": args.method, "RETRIEVER_CACHE_SIZE": "0", "RETRIEVER_SHOW_PROGRESS": "false"}
        with RetrieverProcess(env=env, ready_timeout_s=1800) as server:
            hol = asyncio.run(head_of_line(server.url, args, qs))
            b = asyncio.run(burst(server.url, args, qs))
    report(hol, b)


if __name__ == "__main__":
    main()
