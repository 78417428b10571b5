"""Compressed FAISS index types against Flat on real embeddings: the shipped corpus's MiniLM vectors
(``data/index/wiki_mini``, 16,430 passages) and the 600 questions of the shipped test split, encoded by MiniLM.

Per index type and search-time setting (``nprobe`` for IVF, ``efSearch`` for HNSW): top-3 agreement with Flat (the
same three passages in the same order), overlap of the top-10 with Flat's, answer recall@3 (a gold answer appears in
the top-3 passages, ``data_prep.ceiling.has_answer``) and its ratio to Flat's, bytes per vector on disk, and search
time for the 600 questions (one thread). Then, per type, the cheapest setting keeping >= 0.98 of Flat's answer recall.

    python bench/index_quality_bench.py
    python bench/index_quality_bench.py --flat-only --encoder-backend onnx-int8   # an encoder backend's recall

Last line: ``index_quality_bench flat_answer_recall3=<x> keep98=<type@setting,...>``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

import faiss
import numpy as np

from data_prep.build_default_dataset import DEFAULT_OUT
from data_prep.ceiling import has_answer
from data_prep.rows import read_rows
from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.retrievers.dense import set_search_params
from retriever_server.retrievers.encoder import Encoder
from retriever_server.settings import SHIPPED_CORPUS

# (factory, parameter name, settings to sweep); the last setting of each is the most accurate
TYPES: list[tuple[str, str | None, list[int]]] = [
    ("Flat", None, [0]),
    ("SQfp16", None, [0]),
    ("SQ8", None, [0]),
    ("HNSW32", "efSearch", [16, 32, 64, 128]),
    ("HNSW32,SQ8", "efSearch", [16, 32, 64, 128]),
    ("IVF256,SQ8", "nprobe", [1, 4, 8, 16, 32]),
    ("IVF256,PQ48", "nprobe", [4, 8, 16, 32]),
    ("IVF256,PQ96", "nprobe", [4, 8, 16, 32]),
    ("OPQ48,IVF256,PQ48", "nprobe", [4, 8, 16, 32]),
]


def shipped_vectors() -> np.ndarray:
    parts = sorted((SHIPPED_EMBEDDINGS_DIR / "wiki_mini").glob("embeddings-*.npy"))
    x = np.concatenate([np.load(p) for p in parts]).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def split_questions(split: str) -> tuple[list[str], list[list[str]]]:
    """(questions, gold answers) of a split of the shipped dataset, e.g. ``nq_hotpotqa_mini/test.parquet``."""
    rows = list(read_rows(DEFAULT_OUT / split))
    return [r["question"] for r in rows], [list(r["reward_model"]["ground_truth"]["target"]) for r in rows]


def answer_recall(top: np.ndarray, contents: Sequence[str], answers: list[list[str]], k: int = 3) -> float:
    """Fraction of questions with a gold answer in the first ``k`` passages of their row of ``top`` (Q, >= k)."""
    hits = [has_answer([contents[int(p)] for p in row[:k]], a) for row, a in zip(top, answers, strict=True)]
    return float(np.mean(hits))


def disk_bytes_per_vector(index: faiss.Index) -> float:
    with tempfile.NamedTemporaryFile(suffix=".index") as f:
        faiss.write_index(index, f.name)
        return os.path.getsize(f.name) / index.ntotal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="nq_hotpotqa_mini/test.parquet")
    ap.add_argument("--keep", type=float, default=0.98, help="fraction of Flat's answer recall to keep")
    ap.add_argument("--encoder-backend", default="torch", help="what encodes the questions: torch, onnx or onnx-int8")
    ap.add_argument("--flat-only", action="store_true", help="only the Flat index (to compare encoder backends)")
    args = ap.parse_args()
    faiss.omp_set_num_threads(1)
    vectors = shipped_vectors()
    corpus = load_corpus(SHIPPED_CORPUS)
    questions, answers = split_questions(args.split)
    q = Encoder("all-MiniLM-L6-v2", backend=args.encoder_backend).encode_queries(questions)
    print(f"{len(vectors)} passages, {len(questions)} questions ({args.split}), queries by {args.encoder_backend}")
    flat_top: np.ndarray | None = None
    flat_recall = 0.0
    print("| index | setting | top-3 = Flat's | top-10 overlap | answer recall@3 | vs Flat | bytes/vector | ms/600 q |")
    print("|---|---|---|---|---|---|---|---|")
    keep: list[str] = []
    for factory, param, values in TYPES[:1] if args.flat_only else TYPES:
        t0 = time.perf_counter()
        index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(vectors)
        index.add(vectors)
        build_s = time.perf_counter() - t0
        size = disk_bytes_per_vector(index)
        kept = None
        for value in values:
            if param is not None:
                set_search_params(index, value, value)
            t0 = time.perf_counter()
            _, top = index.search(q, 10)
            search_ms = 1000 * (time.perf_counter() - t0)
            if flat_top is None:
                flat_top = top
            recall = answer_recall(top, corpus.contents, answers)
            flat_recall = flat_recall or recall
            same3 = float(np.mean((top[:, :3] == flat_top[:, :3]).all(axis=1)))
            overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top, flat_top, strict=True)]))
            setting = f"{param}={value}" if param else "-"
            print(f"| {factory} | {setting} | {same3:.3f} | {overlap:.3f} | {recall:.3f} | {recall / flat_recall:.3f} "
                  f"| {size:.0f} | {search_ms:.0f} |", flush=True)  # fmt: skip
            if kept is None and recall >= args.keep * flat_recall:
                kept = f"{factory}@{setting}"
        print(f"<!-- {factory}: built in {build_s:.1f}s -->", flush=True)
        keep.append(kept or f"{factory}@none")
    print(f"index_quality_bench flat_answer_recall3={flat_recall:.3f} keep98={','.join(keep)}")


if __name__ == "__main__":
    main()
