"""Wiki-scale retrieval on synthetic data: N passages shaped like wiki-18's and N clustered unit vectors, a compressed
FAISS index built from the vectors (``retriever_server.index.convert``), and the real server (``python -m
retriever_server --workers 2``) serving the store + index as a prebuilt index with the MiniLM query encoder.

Synthetic passages follow wiki-18's construction (DPR's 100-word splits of Wikipedia, ``"Title"\\ntext``): 90 % of
passages have 100 words, the rest (an article's last split) 10-99; titles 1-4 words; words drawn Zipf-like from a
50,000-word synthetic vocabulary. Vectors: ``--clusters`` random unit centres, each vector a centre plus Gaussian
noise (mostly in a 64-dimensional subspace), normalised. The queries for q/s are real NQ questions encoded by MiniLM
(so the encoder's cost is real); recall@10 against exact search uses fresh draws of the same distribution, searched
in-process.

Reported per N: corpus conversion time, index build time, on-disk sizes, time from launch to ready, RSS per worker
(private memory ``RssAnon`` and mapped file pages ``RssFile``) with 2 workers after the load, q/s and p50/p99 at
32 concurrent clients x 4 queries, recall@10 against exact search. Then a linear fit of build time and index size
to 21M passages (wiki-18).

    python bench/wiki_scale_bench.py --n 2000000 --dim 384 --factory IVF4096,SQ8 --workdir /tmp/wiki-scale

Last line per N: ``wiki_scale_bench n=<N> build_s=... index_gb=... ready_s=... anon_mb_per_worker=... qps_c32=...
p99_ms=... recall10=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil
from retriever_bench import load_questions, run_level

from retriever_server.index.convert import VectorSource, convert
from retriever_server.index.corpus import load_corpus
from retriever_server.launcher import free_port, wait_until_ready
from retriever_server.retrievers.dense import read_faiss_index, set_search_params

WIKI18_ROWS = 21_015_324


def generate_corpus(path: Path, n: int, seed: int) -> None:
    """``n`` jsonl rows ``{"id": str(i), "contents": '"Title"\\ntext'}`` shaped like wiki-18's 100-word splits."""
    rng = np.random.default_rng(seed)
    vocab = [f"{'bcdfghklmnprst'[i % 14]}{i:x}{'aeiou'[i % 5] * (i % 3)}" for i in range(50_000)]
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, 10_000):
            m = min(10_000, n - start)
            words = rng.choice(len(vocab), size=(m, 104), p=zipf).tolist()
            lengths = np.where(rng.random(m) < 0.9, 100, rng.integers(10, 100, m)).tolist()
            titles = rng.integers(1, 5, m).tolist()
            lines = []
            for j in range(m):  # words are [a-z0-9], so the JSON is written without an encoder
                title = " ".join(vocab[w] for w in words[j][100 : 100 + titles[j]]).title()
                body = " ".join(vocab[w] for w in words[j][: lengths[j]])
                lines.append(f'{{"id": "{start + j}", "contents": "\\"{title}\\"\\n{body}"}}')
            f.write("\n".join(lines) + "\n")


class ClusteredVectors:
    """Unit vectors around ``clusters`` random centres, spread in a random 64-dimensional subspace (embeddings have a
    low intrinsic dimension; isotropic noise in all dims would make every neighbour nearly equidistant) plus a
    little isotropic noise. Passages and queries are drawn from the same distribution."""

    def __init__(self, dim: int, clusters: int, noise: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.centres = rng.standard_normal((clusters, dim)).astype(np.float32)
        self.centres /= np.linalg.norm(self.centres, axis=1, keepdims=True)
        self.basis = (rng.standard_normal((64, dim)) / np.sqrt(dim)).astype(np.float32)  # (64, dim)
        self.noise, self.dim = noise, dim

    def draw(self, m: int, rng: np.random.Generator) -> np.ndarray:
        """(m, dim) float32 unit vectors."""
        z = rng.standard_normal((m, 64)).astype(np.float32) * (self.noise / np.sqrt(64))
        x = self.centres[rng.integers(0, len(self.centres), m)] + z @ self.basis  # (m, dim)
        x += rng.normal(scale=0.1 / np.sqrt(self.dim), size=x.shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def generate_vectors(path: Path, n: int, gen: ClusteredVectors, seed: int) -> None:
    """``n`` vectors of ``gen`` as a float32 (n, dim) .npy, written in chunks."""
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, gen.dim))
    for start in range(0, n, 100_000):
        out[start : start + 100_000] = gen.draw(min(100_000, n - start), rng)
    out.flush()


def recall_at_10(
    vectors: Path, index_path: Path, gen: ClusteredVectors, samples: int, seed: int, nprobe: int, ef_search: int
) -> float:
    """Mean overlap of the index's top-10 with the exact inner-product top-10, for ``samples`` fresh draws of
    ``gen``."""
    data = np.load(vectors, mmap_mode="r")
    q = gen.draw(samples, np.random.default_rng(seed + 1))
    best = np.full((samples, 10), -np.inf, dtype=np.float32)
    best_i = np.zeros((samples, 10), dtype=np.int64)
    for start in range(0, len(data), 200_000):  # exact search in chunks: (samples, chunk) scores at a time
        s = q @ np.asarray(data[start : start + 200_000]).T
        top = np.argpartition(-s, 10, axis=1)[:, :10]
        cand_s = np.concatenate([best, np.take_along_axis(s, top, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, top + start], axis=1)
        keep = np.argsort(-cand_s, axis=1)[:, :10]
        best, best_i = np.take_along_axis(cand_s, keep, axis=1), np.take_along_axis(cand_i, keep, axis=1)
    index = read_faiss_index(index_path)
    set_search_params(index, ef_search, nprobe)
    _, found = index.search(q, 10)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, best_i, strict=True)]))


def worker_memory(server: subprocess.Popen[bytes]) -> list[dict[str, float]]:
    """RssAnon / RssFile (MiB) of every uvicorn worker process under the server."""
    out = []
    for child in psutil.Process(server.pid).children(recursive=True):
        status = Path(f"/proc/{child.pid}/status").read_text()
        fields = {k: int(v.split()[0]) / 1024 for k, v in (ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
                  if k in ("RssAnon", "RssFile")}  # fmt: skip
        if "multiprocessing" not in " ".join(child.cmdline()) or fields.get("RssAnon", 0) > 100:
            out.append({"pid": child.pid, "anon_mb": fields["RssAnon"], "file_mb": fields["RssFile"]})
    return out


def serve_and_measure(store: Path, index: Path, args: argparse.Namespace, log: Path) -> dict[str, object]:
    port = free_port()
    env = {**os.environ, "RETRIEVER_CORPUS_PATH": str(store), "RETRIEVER_PREBUILT_INDEX": str(index),
           "RETRIEVER_IVF_NPROBE": str(args.nprobe), "RETRIEVER_HNSW_EF_SEARCH": str(args.ef_search),
           "RETRIEVER_CACHE_SIZE": "0", "RETRIEVER_INDEX_DIR": str(args.workdir / "cache"),
           "RETRIEVER_SHOW_PROGRESS": "false",
           # one worker per core: workers x all-core encoder threads oversubscribe the CPU
           "RETRIEVER_TORCH_THREADS": str(max(1, (os.cpu_count() or 1) // args.workers))}  # fmt: skip
    cmd = [sys.executable, "-m", "retriever_server", "--port", str(port), "--workers", str(args.workers)]
    t0 = time.perf_counter()
    with log.open("ab") as logf:
        server = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_ready(url, 1800, server)
            ready_s = time.perf_counter() - t0  # the first worker ready
            time.sleep(5)  # the other worker finishes loading too (each answers /health on its own)
            questions = load_questions(args.seed)
            need = args.clients * args.requests_per_client * 4
            res = asyncio.run(run_level(url, [questions[i % len(questions)] for i in range(need)], args.clients,
                                        args.requests_per_client, 4, 3))  # fmt: skip
            memory = worker_memory(server)
            health = httpx.get(f"{url}/health").json()
        finally:
            server.terminate()
            server.wait(60)
    return {"ready_s": ready_s, "memory": memory, "health": health, **res}


@dataclass
class Scale:
    """One synthetic scale on disk: the jsonl corpus, its vectors, our store of it and the index built from them."""

    n: int
    corpus: Path
    vectors: Path
    store: Path
    index: Path
    gen: ClusteredVectors
    convert_s: float
    build_s: float


def prepare_scale(n: int, args: argparse.Namespace, rebuild: bool = True) -> Scale:
    """Generate (once) ``n`` passages and vectors under ``args.workdir``, convert the corpus to our store (once) and
    build ``args.factory`` from the vectors (again unless ``rebuild`` is false and the index file is there)."""
    work = args.workdir / f"n{n}-d{args.dim}-c{args.clusters}-s{args.noise}"
    work.mkdir(parents=True, exist_ok=True)
    corpus, vectors = work / "corpus.jsonl", work / "vectors.npy"
    gen = ClusteredVectors(args.dim, args.clusters, args.noise, args.seed)
    if not corpus.exists():
        t = time.perf_counter()
        generate_vectors(vectors, n, gen, args.seed)
        generate_corpus(corpus, n, args.seed)
        print(f"n={n}: generated corpus + vectors in {time.perf_counter() - t:.0f}s", flush=True)
    t = time.perf_counter()
    store = load_corpus(corpus, work / "stores").store.folder
    convert_s = time.perf_counter() - t
    index = work / f"{args.factory.replace(',', '_')}.index"
    t = time.perf_counter()
    if rebuild or not index.exists():
        convert(VectorSource(vectors), args.factory, index, train_rows=args.train_rows)
    build_s = time.perf_counter() - t
    return Scale(n, corpus, vectors, store, index, gen, convert_s, build_s)


def run_one(n: int, args: argparse.Namespace) -> dict[str, object]:
    scale = prepare_scale(n, args)
    recall = recall_at_10(scale.vectors, scale.index, scale.gen, args.recall_samples, args.seed, args.nprobe,
                          args.ef_search)  # fmt: skip
    store_gb = sum(f.stat().st_size for f in scale.store.iterdir()) / 1e9
    row: dict[str, object] = {
        "n": n,
        "dim": args.dim,
        "factory": args.factory,
        "nprobe": args.nprobe,
        "convert_s": scale.convert_s,
        "build_s": scale.build_s,
        "index_gb": scale.index.stat().st_size / 1e9,
        "store_gb": store_gb,
        "passage_bytes": store_gb * 1e9 / n,
        "recall10": recall,
    }
    print(json.dumps(row), flush=True)
    if args.workers > 0:
        served = serve_and_measure(scale.store, scale.index, args, scale.store.parent.parent / "server.log")
        row |= served
    print(json.dumps(row, default=str), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[2_000_000])
    ap.add_argument("--dim", type=int, default=384, help="384 = MiniLM (served end to end); 768 = e5 (no server)")
    ap.add_argument("--factory", default="IVF4096,SQ8")
    ap.add_argument("--nprobe", type=int, default=32)
    ap.add_argument("--ef-search", type=int, default=128)
    ap.add_argument("--train-rows", type=int, default=131_072)
    ap.add_argument("--clusters", type=int, default=2048)
    ap.add_argument("--noise", type=float, default=0.5, help="spread around a centre (norm, the centre's is 1)")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn workers; 0 = no server (768-d, no encoder)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=8)
    ap.add_argument("--recall-samples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wiki-scale"))
    args = ap.parse_args()
    rows = [run_one(n, args) for n in args.n]
    for r in rows:
        mem = r.get("memory") or []
        anon = max((m["anon_mb"] for m in mem), default=float("nan"))  # type: ignore[index]
        print(f"wiki_scale_bench n={r['n']} build_s={r['build_s']:.0f} index_gb={r['index_gb']:.2f} "
              f"store_gb={r['store_gb']:.2f} ready_s={r.get('ready_s', float('nan')):.1f} "
              f"anon_mb_per_worker={anon:.0f} qps_c{args.clients}={r.get('qps', float('nan')):.1f} "
              f"p99_ms={1000 * r.get('p99_s', float('nan')):.0f} recall10={r['recall10']:.3f}")  # fmt: skip
    if len(rows) >= 2:
        ns = np.array([r["n"] for r in rows], dtype=float)
        for key in ("build_s", "index_gb", "store_gb", "convert_s"):
            slope, intercept = np.polyfit(ns, np.array([r[key] for r in rows], dtype=float), 1)
            print(f"fit {key} at {WIKI18_ROWS:,} rows: {slope * WIKI18_ROWS + intercept:.2f}")


if __name__ == "__main__":
    main()
