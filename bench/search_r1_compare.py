"""Our retriever against Search-R1's own ``retrieval_server.py``, in the same run on the same machine: the shipped
corpus, the same encoder (all-MiniLM-L6-v2, mean pooling, unit length), the same FAISS Flat index file, closed-loop
clients sending requests of distinct real NQ questions (``retriever_bench.run_level``), caches off.

Search-R1's server is run as it is, with two changes a CPU needs: ``.cuda()`` is a no-op and ``.half()`` is too
(fp16 matmuls are slower than fp32 on CPU); its ``faiss_gpu`` is off. It needs the ``datasets`` package, which the
project does not depend on: point ``--extra-path`` at a folder holding it (``pip install --target DIR datasets``).

    python bench/search_r1_compare.py --search-r1 Search-R1/search_r1/search/retrieval_server.py --extra-path DIR

Rounds alternate the two servers (ours, then Search-R1's) so both see the same machine. Last line:
``search_r1_compare ours_qps=<x> ours_p99_ms=<y> search_r1_qps=<x> search_r1_p99_ms=<y> ratio=<ours/theirs>``
(medians over the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from retriever_bench import enough, load_questions, run_level

from retriever_server.index.build import build_index
from retriever_server.index.corpus import load_corpus
from retriever_server.launcher import RetrieverProcess, free_port
from retriever_server.retrievers.encoder import resolve_encoder_path
from retriever_server.settings import Method, Settings

CPU_PATCH = (
    "import runpy, sys, torch\n"
    "torch.nn.Module.cuda = lambda self, *a, **k: self\n"
    "torch.nn.Module.half = lambda self, *a, **k: self\n"
    "torch.Tensor.cuda = lambda self, *a, **k: self\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def start_search_r1(script: Path, index: Path, corpus: Path, encoder: str, extra: Path | None, log: Path):
    """Search-R1's server on port 8000 (hard-coded there), dense, top-3; returns the process once it answers."""
    cmd = [
        sys.executable,
        "-c",
        CPU_PATCH,
        str(script),
        "--index_path",
        str(index),
        "--corpus_path",
        str(corpus),
        "--topk",
        "3",
        "--retriever_name",
        "minilm",  # not e5/bge: no query prefix, mean pooling, normalised (what our encoder does)
        "--retriever_model",
        encoder,
    ]
    env = dict(os.environ)
    if extra is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra), env.get("PYTHONPATH")]))
    process = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=script.parent)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"Search-R1's server exited with code {process.returncode}; see {log}")
        try:
            r = httpx.post(
                "http://127.0.0.1:8000/retrieve",
                json={"queries": ["warm up"], "topk": 3, "return_scores": True},
                timeout=30,
            )
            if r.status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(1)
    process.kill()
    sys.exit("Search-R1's server did not answer within 600 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--search-r1", type=Path, required=True, help="Search-R1's search_r1/search/retrieval_server.py")
    ap.add_argument("--extra-path", type=Path, default=None, help="a folder with the datasets package")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=8)
    ap.add_argument("--queries-per-request", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/search_r1_compare"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(show_progress=False)
    corpus = load_corpus(settings.corpus_path)
    index = build_index(corpus, Method.dense, settings) / "index.faiss"
    encoder = resolve_encoder_path(settings.encoder_model)
    per_round = args.clients * args.requests_per_client * args.queries_per_request
    questions = enough(load_questions(args.seed), 2 * args.rounds * per_round)
    theirs = start_search_r1(
        args.search_r1, index, settings.corpus_path, encoder, args.extra_path, args.out / "search_r1.log"
    )
    ours = RetrieverProcess(env={"RETRIEVER_CACHE_SIZE": "0"}, port=free_port(), log_path=args.out / "ours.log")
    results: dict[str, list[dict[str, float]]] = {"ours": [], "search_r1": []}
    try:
        ours.start()
        offset = 0
        for r in range(args.rounds):
            for name, url in (("ours", ours.url), ("search_r1", "http://127.0.0.1:8000")):
                batch = questions[offset : offset + per_round]
                offset += per_round
                res = asyncio.run(
                    run_level(url, batch, args.clients, args.requests_per_client, args.queries_per_request, 2)
                )
                results[name].append(res)
                print(
                    f"round {r + 1} {name:>9}: {res['qps']:6.1f} queries/s  p50={res['p50_s'] * 1000:6.0f} ms  "
                    f"p99={res['p99_s'] * 1000:6.0f} ms",
                    flush=True,
                )
    finally:
        ours.stop()
        theirs.terminate()
        theirs.wait(30)

    def med(name: str, key: str) -> float:
        return statistics.median(res[key] for res in results[name])

    print(
        f"search_r1_compare ours_qps={med('ours', 'qps'):.1f} ours_p99_ms={med('ours', 'p99_s') * 1000:.0f} "
        f"search_r1_qps={med('search_r1', 'qps'):.1f} search_r1_p99_ms={med('search_r1', 'p99_s') * 1000:.0f} "
        f"ratio={med('ours', 'qps') / med('search_r1', 'qps'):.2f}"
    )


if __name__ == "__main__":
    main()
