"""First start of the retriever on a fresh machine: seconds from launching ``uvicorn retriever_server.app:app`` to
``GET /health`` answering ready, with an empty cache (``HOME`` and ``XDG_CACHE_HOME`` pointed at a new temporary
folder) and the default settings (dense MiniLM + FAISS Flat over the shipped corpus). Then a second start on the
now-warm cache. Every ``/health`` progress step is printed with the second it was first seen.

    python bench/first_start_bench.py                # one fresh start + one warm start
    python bench/first_start_bench.py --runs 3

Last line: ``first_start_bench fresh_s=<median> warm_s=<median> embeddings=<where the vectors came from>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from retriever_server.launcher import free_port


def start_once(env: dict[str, str], timeout_s: float) -> tuple[float, list[tuple[float, str]]]:
    """Launch a server, poll /health every 0.1 s until ready; return (seconds to ready, [(second, step)])."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "retriever_server.app:app", "--port", str(port)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps: list[tuple[float, str]] = []
    try:
        with httpx.Client(timeout=5) as client:
            while time.perf_counter() - t0 < timeout_s:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}")
                try:
                    r = client.get(f"http://127.0.0.1:{port}/health")
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                if r.status_code == 200:
                    return time.perf_counter() - t0, steps
                body = r.json()
                if body["status"] == "failed":
                    raise RuntimeError(f"index load failed: {body.get('error')}")
                step = (body.get("progress") or {}).get("stage")
                if step and (not steps or steps[-1][1] != step):
                    steps.append((time.perf_counter() - t0, step))
                time.sleep(0.1)
        raise TimeoutError(f"not ready after {timeout_s} s")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1, help="fresh caches to start from (each followed by a warm start)")
    ap.add_argument("--timeout-s", type=float, default=1800)
    args = ap.parse_args()
    fresh, warm, sources = [], [], set()
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="search-rl-first-start-") as home:
            env = {k: v for k, v in os.environ.items() if not k.startswith("RETRIEVER_")}
            env |= {"HOME": home, "XDG_CACHE_HOME": str(Path(home) / ".cache"), "HF_HUB_OFFLINE": "1"}
            seconds, steps = start_once(env, args.timeout_s)
            fresh.append(seconds)
            print(
                f"run {run}: fresh cache ready in {seconds:.1f} s; steps: "
                + ", ".join(f"{t:.1f}s {s}" for t, s in steps)
            )
            for meta in Path(home, ".cache", "search-rl", "indexes").glob("dense-*/meta.json"):
                sources.add(json.loads(meta.read_text())["embeddings"].split(" /")[0])
            seconds, _ = start_once(env, args.timeout_s)
            warm.append(seconds)
            print(f"run {run}: warm cache ready in {seconds:.1f} s")
    print(
        f"first_start_bench fresh_s={statistics.median(fresh):.1f} warm_s={statistics.median(warm):.1f} "
        f"embeddings={'|'.join(sorted(sources)) or '?'}"
    )


if __name__ == "__main__":
    main()
