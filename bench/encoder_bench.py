"""Query encoder throughput per backend (``RETRIEVER_ENCODER_BACKEND``), batch size and intra-op threads: queries per
second encoding the shipped test questions (``nq_hotpotqa_mini/test.parquet``) with MiniLM.

    python bench/encoder_bench.py                      # torch, onnx, onnx-int8 x threads 1, 2 x batch 1, 8, 32, 128
    python bench/encoder_bench.py --backends onnx-int8 --threads 2 --batch-sizes 32 --queries 600

One line per configuration: ``encoder_bench backend=<b> threads=<t> batch=<n> qps=<x>``; then per backend its
agreement with torch over the first 64 questions, ``encoder_bench backend=<b> min_cosine_to_torch=<c>
max_alone_vs_batched=<d>`` (the largest difference of an embedding component between a question encoded alone and in
a batch of 64: what a server's answer to one request may owe to the requests batched with it). ONNX exports are made
on first use into ``--cache-dir`` (default: the user cache's ``indexes/encoders``, where the server looks) and
reused.
Run it on an otherwise idle machine: figures from a shared one are noise.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from data_prep.build_default_dataset import DEFAULT_OUT
from data_prep.rows import read_rows
from retriever_server.retrievers.encoder import Encoder, default_export_cache
from retriever_server.settings import DEFAULT_ENCODER, EncoderBackend


def queries_per_second(encoder: Encoder, questions: list[str], batch_size: int, repeats: int) -> float:
    """Best of ``repeats`` timed passes over ``questions`` (after one untimed batch to warm up)."""
    encoder.encode_queries(questions[:batch_size], batch_size=batch_size)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        encoder.encode_queries(questions, batch_size=batch_size)
        best = min(best, time.perf_counter() - t0)
    return len(questions) / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=[b.value for b in EncoderBackend if b is not EncoderBackend.auto])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32, 128])
    ap.add_argument("--queries", type=int, default=256, help="first N test questions (600 in all)")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per configuration; the best is reported")
    ap.add_argument("--model", default=DEFAULT_ENCODER)
    ap.add_argument("--cache-dir", type=Path, default=None, help="ONNX export cache (default: the user cache's)")
    args = ap.parse_args()
    cache_dir = args.cache_dir or default_export_cache()
    rows = read_rows(DEFAULT_OUT / "nq_hotpotqa_mini" / "test.parquet")
    questions = [r["question"] for _, r in zip(range(args.queries), rows, strict=False)]
    print(f"{len(questions)} questions, model {args.model}")
    for backend in args.backends:
        for threads in args.threads:
            encoder = Encoder(args.model, backend=backend, threads=threads, cache_dir=cache_dir)
            for batch_size in args.batch_sizes:
                qps = queries_per_second(encoder, questions, batch_size, args.repeats)
                print(f"encoder_bench backend={backend} threads={threads} batch={batch_size} qps={qps:.1f}", flush=True)
    reference = Encoder(args.model, backend="torch").encode_queries(questions[:64])
    for backend in args.backends:
        cosine, drift = agreement(Encoder(args.model, backend=backend, cache_dir=cache_dir), questions[:64], reference)
        print(f"encoder_bench backend={backend} min_cosine_to_torch={cosine:.4f} max_alone_vs_batched={drift:.2e}")


def agreement(encoder: Encoder, questions: list[str], reference: np.ndarray) -> tuple[float, float]:
    """(smallest cosine to ``reference``'s embeddings, largest |alone - batched| component) over ``questions``."""
    batched = encoder.encode_queries(questions, batch_size=len(questions))
    alone = np.concatenate([encoder.encode_queries([q], batch_size=1) for q in questions])
    return float((batched * reference).sum(axis=1).min()), float(np.abs(alone - batched).max())


if __name__ == "__main__":
    main()
