"""Our retriever against Search-R1's own ``retrieval_server.py``, in the same run on the same machine, at each scale
asked for: the same encoder (all-MiniLM-L6-v2, mean pooling, unit length), the same FAISS index file, the same
corpus, closed-loop clients sending requests of distinct real NQ questions (``retriever_bench.run_level``), caches
off.

Scales (``--passages``): ``0`` is the shipped corpus with an exact Flat index; ``N`` > 0 is wiki_scale_bench's
synthetic wiki-18-shaped corpus of N passages with an ``--factory`` index (IVF4096,SQ8) built from its vectors,
searched at ``--nprobe`` (default: our server's default, 16) by both servers (Search-R1 leaves FAISS's default of
1 probe; it is set to ours so both do the same search). Recall@10 against exact search is the index's (the same file
for both) at that nprobe, measured on fresh draws.

Search-R1's server is run as it is, with two changes a CPU needs: ``.cuda()`` is a no-op and ``.half()`` is too
(fp16 matmuls are slower than fp32 on CPU); its ``faiss_gpu`` is off. It needs the ``datasets`` package, which the
project does not depend on: point ``--extra-path`` at a folder holding it (``pip install --target DIR datasets``).

    python bench/search_r1_compare.py --search-r1 Search-R1/search_r1/search/retrieval_server.py --extra-path DIR \
        --passages 0 2000000

Rounds alternate the two servers (ours, then Search-R1's) so both see the same machine. Before the rounds, both
servers answer the same questions and the agreement of their top-3 ids is printed (same encoder, same index: it
should be ~1). Last line per scale: ``search_r1_compare passages=<N> ours_qps=<x> ours_p50_ms=.. ours_p99_ms=<y>
search_r1_qps=<x> search_r1_p50_ms=.. search_r1_p99_ms=<y> ratio=<ours/theirs> recall10=<r> top3_agreement=<a>``
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
from dataclasses import dataclass
from pathlib import Path

import httpx
from retriever_bench import enough, load_questions, run_level
from wiki_scale_bench import prepare_scale, recall_at_10

from retriever_server.index.build import build_index
from retriever_server.index.corpus import load_corpus
from retriever_server.launcher import RetrieverProcess, free_port
from retriever_server.retrievers.encoder import resolve_encoder_path
from retriever_server.settings import Method, Settings

CPU_PATCH = (
    "import os, runpy, sys, faiss, torch\n"
    "_nprobe = int(os.environ.get('SEARCH_R1_NPROBE', '0'))\n"
    "if _nprobe:\n"
    "    _read = faiss.read_index\n"
    "    def _read_nprobe(*a, **k):\n"
    "        index = _read(*a, **k)\n"
    "        faiss.extract_index_ivf(index).nprobe = _nprobe\n"
    "        return index\n"
    "    faiss.read_index = _read_nprobe\n"
    "torch.nn.Module.cuda = lambda self, *a, **k: self\n"
    "torch.nn.Module.half = lambda self, *a, **k: self\n"
    "torch.Tensor.cuda = lambda self, *a, **k: self\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
SEARCH_R1_URL = "http://127.0.0.1:8000"


def start_search_r1(
    script: Path, index: Path, corpus: Path, encoder: str, extra: Path | None, nprobe: int, out: Path
) -> subprocess.Popen[bytes]:
    """Search-R1's server on port 8000 (hard-coded there), dense, top-3; returns the process once it answers."""
    cmd = [sys.executable, "-c", CPU_PATCH, str(script), "--index_path", str(index), "--corpus_path", str(corpus),
           "--topk", "3",
           "--retriever_name", "minilm",  # not e5/bge: no query prefix, mean pooling, normalised (as ours)
           "--retriever_model", encoder]  # fmt: skip
    env = {**os.environ, "SEARCH_R1_NPROBE": str(nprobe), "HF_DATASETS_CACHE": str(out / "hf-datasets")}
    if extra is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra), env.get("PYTHONPATH")]))
    log = out / "search_r1.log"
    process = subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=script.parent)
    deadline = time.monotonic() + 1800  # at 2M passages, `datasets` converts the jsonl first
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"Search-R1's server exited with code {process.returncode}; see {log}")
        try:
            r = httpx.post(
                f"{SEARCH_R1_URL}/retrieve", json={"queries": ["warm up"], "topk": 3, "return_scores": True}, timeout=30
            )
            if r.status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(1)
    process.kill()
    sys.exit("Search-R1's server did not answer within 1800 s")


def top3_agreement(ours: str, theirs: str, questions: list[str]) -> float:
    """Mean overlap of the two servers' top-3 document ids for ``questions`` (asked in requests of 8)."""
    overlaps = []
    for i in range(0, len(questions), 8):
        body = {"queries": questions[i : i + 8], "topk": 3, "return_scores": True}
        a, b = (httpx.post(f"{url}/retrieve", json=body, timeout=120).json()["result"] for url in (ours, theirs))
        for x, y in zip(a, b, strict=True):
            overlaps.append(len({d["document"]["id"] for d in x} & {d["document"]["id"] for d in y}) / 3)
    return statistics.mean(overlaps)


@dataclass
class Setup:
    """What both servers serve at one scale."""

    passages: int
    corpus_jsonl: Path
    index: Path
    our_env: dict[str, str]
    nprobe: int  # 0: not an IVF index
    recall10: float  # the index's top-10 against exact search (1.0 for Flat)


def shipped_setup(settings: Settings) -> Setup:
    """The shipped corpus and its exact Flat index (built by our builder, read by both)."""
    index = build_index(load_corpus(settings.corpus_path), Method.dense, settings) / "index.faiss"
    return Setup(0, settings.corpus_path, index, {}, 0, 1.0)


def synthetic_setup(n: int, args: argparse.Namespace) -> Setup:
    """wiki_scale_bench's synthetic corpus of ``n`` passages with a ``--factory`` index, served prebuilt by ours."""
    scale_args = argparse.Namespace(workdir=args.workdir, dim=384, clusters=2048, noise=0.5, seed=0,
                                    factory=args.factory, train_rows=131_072)  # fmt: skip
    scale = prepare_scale(n, scale_args, rebuild=False)
    recall = recall_at_10(scale.vectors, scale.index, scale.gen, 500, 0, args.nprobe, 128)
    env = {
        "RETRIEVER_CORPUS_PATH": str(scale.store),
        "RETRIEVER_PREBUILT_INDEX": str(scale.index),
        "RETRIEVER_IVF_NPROBE": str(args.nprobe),
        "RETRIEVER_INDEX_DIR": str(scale.store.parent.parent / "cache"),
    }
    return Setup(n, scale.corpus, scale.index, env, args.nprobe, recall)


def compare(setup: Setup, questions: list[str], encoder: str, args: argparse.Namespace) -> dict[str, float]:
    """Both servers up at once, rounds alternating; medians over the rounds."""
    per_round = args.clients * args.requests_per_client * args.queries_per_request
    theirs = start_search_r1(args.search_r1, setup.index, setup.corpus_jsonl, encoder, args.extra_path, setup.nprobe,
                             args.out)  # fmt: skip
    ours = RetrieverProcess(env={"RETRIEVER_CACHE_SIZE": "0", **setup.our_env}, port=free_port(),
                            log_path=args.out / "ours.log")  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {"ours": [], "search_r1": []}
    try:
        ours.start()
        agreement = top3_agreement(ours.url, SEARCH_R1_URL, questions[:64])
        print(f"passages={setup.passages}: top-3 agreement between the servers {agreement:.3f}", flush=True)
        offset = 64
        for r in range(args.rounds):
            for name, url in (("ours", ours.url), ("search_r1", SEARCH_R1_URL)):
                batch = questions[offset : offset + per_round]
                offset += per_round
                res = asyncio.run(
                    run_level(url, batch, args.clients, args.requests_per_client, args.queries_per_request, 2)
                )
                results[name].append(res)
                print(
                    f"passages={setup.passages} round {r + 1} {name:>9}: {res['qps']:6.1f} queries/s  "
                    f"p50={res['p50_s'] * 1000:6.0f} ms  p99={res['p99_s'] * 1000:6.0f} ms",
                    flush=True,
                )
    finally:
        ours.stop()
        theirs.terminate()
        theirs.wait(60)

    def med(name: str, key: str) -> float:
        return statistics.median(res[key] for res in results[name])

    return {"agreement": agreement, **{f"{name}_{key}": med(name, key) for name in results for key in
                                       ("qps", "p50_s", "p99_s")}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--search-r1", type=Path, required=True, help="Search-R1's search_r1/search/retrieval_server.py")
    ap.add_argument("--extra-path", type=Path, default=None, help="a folder with the datasets package")
    ap.add_argument("--passages", type=int, nargs="+", default=[0], help="0 = the shipped corpus (Flat); N = synthetic")
    ap.add_argument("--factory", default="IVF4096,SQ8", help="the index at synthetic scales")
    ap.add_argument(
        "--nprobe",
        type=int,
        default=Settings.model_fields["ivf_nprobe"].default,
        help="IVF probes, both servers (synthetic scales); default: our server's default",
    )
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wiki-scale"), help="synthetic data (reused)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=8)
    ap.add_argument("--queries-per-request", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/search_r1_compare"))
    args = ap.parse_args()
    if any(n < 0 for n in args.passages):
        ap.error(f"--passages: counts must be >= 0 (0 = the shipped corpus), got {args.passages}")
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(show_progress=False)
    encoder = resolve_encoder_path(settings.encoder_model)
    per_round = args.clients * args.requests_per_client * args.queries_per_request
    questions = enough(load_questions(args.seed), 64 + 2 * args.rounds * per_round)
    lines = []
    for n in args.passages:
        setup = shipped_setup(settings) if n == 0 else synthetic_setup(n, args)
        m = compare(setup, questions, encoder, args)
        lines.append(
            f"search_r1_compare passages={n} ours_qps={m['ours_qps']:.1f} ours_p50_ms={m['ours_p50_s'] * 1000:.0f} "
            f"ours_p99_ms={m['ours_p99_s'] * 1000:.0f} search_r1_qps={m['search_r1_qps']:.1f} "
            f"search_r1_p50_ms={m['search_r1_p50_s'] * 1000:.0f} search_r1_p99_ms={m['search_r1_p99_s'] * 1000:.0f} "
            f"ratio={m['ours_qps'] / m['search_r1_qps']:.2f} recall10={setup.recall10:.3f} "
            f"top3_agreement={m['agreement']:.3f}"
        )
        print(lines[-1], flush=True)
    if len(lines) > 1:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
