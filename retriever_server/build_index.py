"""Build, cache and load retrieval indexes.

An index lives in ``<index_dir>/<method>-<key>/`` where ``key`` hashes the corpus bytes, the encoder and every
index setting, so a changed corpus or setting builds a new index and an unchanged one loads in seconds. Builds
are safe to re-run: dense embeddings are saved in chunks as they are computed (an interrupted build resumes from
the last finished chunk), the final folder appears atomically by rename, and a file lock keeps two processes from
building the same index at once. CLI for large corpora::

    python -m retriever_server.build_index --corpus wiki18.jsonl --method dense --out ~/.cache/search-rl/indexes \
        --index-factory HNSW32 --batch-size 256
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from retriever_server.corpus import Corpus, load_corpus
from retriever_server.retrievers.base import Retriever
from retriever_server.retrievers.bm25 import BM25Retriever, build_bm25
from retriever_server.retrievers.dense import Encoder, FaissDenseRetriever, build_faiss_index
from retriever_server.retrievers.hybrid import HybridRetriever
from retriever_server.settings import Method, Settings

logger = logging.getLogger(__name__)

INDEX_FORMAT_VERSION = 1
EMBED_CHUNK = 2048  # passages per saved embedding chunk: the unit of resumption


def index_key(corpus_sha256: str, method: Method, settings: Settings) -> str:
    """Hash of everything that changes the index's content (not search-time knobs such as nprobe)."""
    parts: dict[str, object] = {"version": INDEX_FORMAT_VERSION, "corpus": corpus_sha256, "method": method.value}
    if method is Method.dense:
        q, p = settings.resolved_prefixes()
        parts |= {"encoder": settings.encoder_model, "passage_prefix": p, "factory": settings.index_factory}
        del q  # query prefix changes queries only, never the stored vectors
    elif method is Method.bm25:
        parts |= {"k1": settings.bm25_k1, "b": settings.bm25_b}
    else:
        raise ValueError(f"hybrid has no index of its own; key its components ({method})")
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def index_path(corpus: Corpus, method: Method, settings: Settings) -> Path:
    """Folder of the cached index for this corpus and settings."""
    return settings.index_dir / f"{method.value}-{index_key(corpus.sha256, method, settings)}"


def _make_encoder(settings: Settings) -> Encoder:
    q, p = settings.resolved_prefixes()
    return Encoder(settings.encoder_model, query_prefix=q, passage_prefix=p, query_batch_size=settings.query_batch_size)


def _encode_resumable(corpus: Corpus, encoder: Encoder, partial: Path, settings: Settings) -> np.ndarray:
    partial.mkdir(parents=True, exist_ok=True)
    n = len(corpus)
    bar = tqdm(total=n, desc="encoding corpus", unit="psg", disable=not settings.show_progress)
    chunks = []
    for i, start in enumerate(range(0, n, EMBED_CHUNK)):
        texts = corpus.contents[start : start + EMBED_CHUNK]
        f = partial / f"emb-{i:06d}.npy"
        if f.exists():
            emb = np.load(f)
        else:
            emb = encoder.encode_passages(texts, batch_size=settings.encode_batch_size)
            tmp = partial / f"emb-{i:06d}.tmp.npy"
            np.save(tmp, emb)
            tmp.replace(f)
        chunks.append(emb)
        bar.update(len(texts))
    bar.close()
    return np.concatenate(chunks)


def _write_meta(folder: Path, corpus: Corpus, method: Method, settings: Settings, seconds: float) -> None:
    meta = {
        "method": method.value,
        "corpus_path": str(corpus.path),
        "corpus_sha256": corpus.sha256,
        "num_documents": len(corpus),
        "encoder_model": settings.encoder_model if method is Method.dense else None,
        "index_factory": settings.index_factory if method is Method.dense else None,
        "bm25": {"k1": settings.bm25_k1, "b": settings.bm25_b} if method is Method.bm25 else None,
        "build_seconds": round(seconds, 2),
        "format_version": INDEX_FORMAT_VERSION,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))


def build_index(corpus: Corpus, method: Method, settings: Settings, encoder: Encoder | None = None) -> Path:
    """Build the index for ``method`` into its cache folder unless it is already there; return the folder."""
    target = index_path(corpus, method, settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "meta.json").exists():
            return target
        t0 = time.perf_counter()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        logger.info("building %s index over %d documents into %s", method.value, len(corpus), target)
        if method is Method.dense:
            import faiss

            enc = encoder or _make_encoder(settings)
            partial = target.with_name(target.name + ".partial")
            embeddings = _encode_resumable(corpus, enc, partial, settings)
            faiss.write_index(build_faiss_index(embeddings, settings.index_factory), str(tmp / "index.faiss"))
        else:
            build_bm25(corpus.contents, settings.bm25_k1, settings.bm25_b, settings.show_progress).save(
                str(tmp / "bm25"), show_progress=False
            )
        _write_meta(tmp, corpus, method, settings, time.perf_counter() - t0)
        tmp.replace(target)
        shutil.rmtree(target.with_name(target.name + ".partial"), ignore_errors=True)
        logger.info("built %s index in %.1fs", method.value, time.perf_counter() - t0)
    return target


def _load_one(corpus: Corpus, method: Method, settings: Settings) -> Retriever:
    if method is Method.dense:
        import faiss

        encoder = _make_encoder(settings)
        folder = build_index(corpus, method, settings, encoder=encoder)
        index = faiss.read_index(str(folder / "index.faiss"))
        if index.ntotal != len(corpus):
            raise ValueError(f"{folder}: index holds {index.ntotal} vectors but the corpus has {len(corpus)} rows")
        return FaissDenseRetriever(index, encoder, settings.hnsw_ef_search, settings.ivf_nprobe)
    folder = build_index(corpus, method, settings)
    return BM25Retriever.load(folder / "bm25", len(corpus))


def load_retriever(corpus: Corpus, settings: Settings) -> Retriever:
    """The retriever for ``settings.method``, building any missing index first."""
    if settings.torch_threads:
        import faiss
        import torch

        torch.set_num_threads(settings.torch_threads)
        faiss.omp_set_num_threads(settings.torch_threads)
    if settings.method is Method.hybrid:
        return HybridRetriever(
            _load_one(corpus, Method.dense, settings),
            _load_one(corpus, Method.bm25, settings),
            rrf_k=settings.rrf_k,
            candidates=settings.hybrid_candidates,
        )
    return _load_one(corpus, settings.method, settings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="corpus jsonl(.gz) with id/contents rows")
    ap.add_argument("--method", choices=["dense", "bm25"], required=True)
    ap.add_argument("--out", type=Path, required=True, help="index cache root (what RETRIEVER_INDEX_DIR points at)")
    ap.add_argument("--encoder", default=None, help="sentence-transformers model (default: settings' encoder)")
    ap.add_argument("--index-factory", default=None, help="FAISS index-factory string, e.g. Flat, HNSW32, IVF4096,PQ64")
    ap.add_argument("--batch-size", type=int, default=None, help="passages per encoder batch")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides: dict[str, object] = {"index_dir": args.out, "method": args.method, "corpus_path": args.corpus}
    if args.encoder:
        overrides["encoder_model"] = args.encoder
    if args.index_factory:
        overrides["index_factory"] = args.index_factory
    if args.batch_size:
        overrides["encode_batch_size"] = args.batch_size
    settings = Settings(**overrides)  # type: ignore[arg-type]
    corpus = load_corpus(settings.corpus_path)
    folder = build_index(corpus, settings.method, settings)
    logger.info("index ready at %s", folder)
    env = [f"RETRIEVER_INDEX_DIR={args.out}", f"RETRIEVER_CORPUS_PATH={args.corpus}", f"RETRIEVER_METHOD={args.method}"]
    if args.encoder:
        env.append(f"RETRIEVER_ENCODER_MODEL={args.encoder}")
    if args.index_factory:
        env.append(f"RETRIEVER_INDEX_FACTORY='{args.index_factory}'")
    logger.info("serve it with: %s uvicorn retriever_server.app:app", " ".join(env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
