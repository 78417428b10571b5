"""Build, cache and load retrieval indexes.

An index lives in ``<index_dir>/<method>-<key>/`` where ``key`` hashes the corpus bytes, the encoder and every
index setting, so a changed corpus or setting builds a new index and an unchanged one loads in seconds. Builds
are safe to re-run: dense embeddings are saved in chunks as they are computed (an interrupted build resumes from
the last finished chunk), the final folder appears atomically by rename, and a file lock keeps two processes from
building the same index at once. A dense build first looks for shipped embeddings of the corpus
(:mod:`retriever_server.index.shipped_embeddings`) and encodes only when none match. Long steps report to an optional
``progress(stage, done, total)`` callback (the server shows it on ``GET /health``). CLI for large corpora::

    python -m retriever_server.index.build --corpus wiki18.jsonl --method dense --out ~/.cache/search-rl/indexes \
        --index-factory HNSW32 --batch-size 256

``--export-shipped DIR`` encodes the corpus afresh (ignoring shipped embeddings), caches that index as usual, and
writes the embeddings as a shipped float16 set into ``DIR`` (how ``data/index/wiki_mini`` is made).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from retriever_server.index.corpus import Corpus, load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR, shipped_embeddings, write_embeddings
from retriever_server.retrievers.base import Retriever
from retriever_server.retrievers.bm25 import BM25Retriever, build_bm25
from retriever_server.retrievers.encoder import Encoder
from retriever_server.retrievers.hybrid import HybridRetriever
from retriever_server.settings import Method, Settings

logger = logging.getLogger(__name__)

INDEX_FORMAT_VERSION = 1
EMBED_CHUNK = 2048  # passages per saved embedding chunk: the unit of resumption

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as a long build step advances (``done`` of ``total`` items)."""


def _no_progress(stage: str, done: int, total: int) -> None:
    del stage, done, total


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


def make_encoder(settings: Settings) -> Encoder:
    """The query/passage encoder that ``settings`` configure (the prefixes resolved)."""
    q, p = settings.resolved_prefixes()
    return Encoder(
        settings.encoder_model,
        q,
        p,
        query_batch_size=settings.query_batch_size,
        device=settings.encoder_device,
        backend=settings.encoder_backend,
        threads=settings.encoder_threads or settings.torch_threads,
    )


def _encode_resumable(
    corpus: Corpus, encoder: Encoder, partial: Path, settings: Settings, progress: ProgressFn = _no_progress
) -> np.ndarray:
    partial.mkdir(parents=True, exist_ok=True)
    n, step = len(corpus), settings.encode_batch_size
    bar = tqdm(total=n, desc="encoding corpus", unit="psg", disable=not settings.show_progress)
    chunks = []
    progress("encoding corpus", 0, n)
    for i, start in enumerate(range(0, n, EMBED_CHUNK)):
        texts = corpus.contents[start : start + EMBED_CHUNK]
        f = partial / f"emb-{i:06d}.npy"
        if f.exists():
            emb = np.load(f)
            bar.update(len(texts))
        else:
            batches = []  # one encoder call per batch, so progress moves every few seconds, not every chunk
            for b in range(0, len(texts), step):
                batches.append(encoder.encode_passages(texts[b : b + step], batch_size=step))
                bar.update(len(batches[-1]))
                progress("encoding corpus", start + b + len(batches[-1]), n)
            emb = np.concatenate(batches)
            tmp = partial / f"emb-{i:06d}.tmp.npy"
            np.save(tmp, emb)
            tmp.replace(f)
        chunks.append(emb)
        progress("encoding corpus", start + len(texts), n)
    bar.close()
    return np.concatenate(chunks)


def _write_meta(
    folder: Path, corpus: Corpus, method: Method, settings: Settings, seconds: float, embeddings: str | None
) -> None:
    meta = {
        "method": method.value,
        "corpus_path": str(corpus.path),
        "corpus_sha256": corpus.sha256,
        "num_documents": len(corpus),
        "encoder_model": settings.encoder_model if method is Method.dense else None,
        "index_factory": settings.index_factory if method is Method.dense else None,
        "bm25": {"k1": settings.bm25_k1, "b": settings.bm25_b} if method is Method.bm25 else None,
        "embeddings": embeddings,
        "build_seconds": round(seconds, 2),
        "format_version": INDEX_FORMAT_VERSION,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))


def _dense_embeddings(
    corpus: Corpus, settings: Settings, encoder: Encoder, partial: Path, shipped_root: Path | None, progress: ProgressFn
) -> tuple[np.ndarray, str]:
    """The corpus embeddings and where they came from: a verified shipped set, else the encoder."""
    if shipped_root is not None:
        progress("checking shipped embeddings", 0, len(corpus))
        found = shipped_embeddings(corpus, settings, encoder, shipped_root)
        if found is not None:
            progress("checking shipped embeddings", len(corpus), len(corpus))
            return found[0], f"shipped float16 set {found[1]}"
    return _encode_resumable(corpus, encoder, partial, settings, progress), f"encoded by {settings.encoder_model}"


def build_index(
    corpus: Corpus,
    method: Method,
    settings: Settings,
    encoder: Encoder | None = None,
    progress: ProgressFn = _no_progress,
    shipped_root: Path | None = SHIPPED_EMBEDDINGS_DIR,
    export_to: Path | None = None,
) -> Path:
    """Build the index for ``method`` into its cache folder unless it is already there; return the folder.

    Args:
        shipped_root: where to look for shipped embeddings of the corpus (dense); None always encodes.
        export_to: dense only: encode afresh (even if cached), replace the cached index, and write the embeddings
            as a shipped float16 set into this folder.
    """
    target = index_path(corpus, method, settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "meta.json").exists() and export_to is None:
            return target
        t0 = time.perf_counter()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        logger.info("building %s index over %d documents into %s", method.value, len(corpus), target)
        source = None
        if method is Method.dense:
            import faiss

            from retriever_server.retrievers.dense import build_faiss_index

            enc = encoder or make_encoder(settings)
            partial = target.with_name(target.name + ".partial")
            root = None if export_to is not None else shipped_root
            embeddings, source = _dense_embeddings(corpus, settings, enc, partial, root, progress)
            if export_to is not None:
                write_embeddings(embeddings, corpus, settings, export_to)
            progress("building faiss index", 0, len(corpus))
            faiss.write_index(build_faiss_index(embeddings, settings.index_factory), str(tmp / "index.faiss"))
        else:
            progress("building bm25 index", 0, len(corpus))
            build_bm25(list(corpus.contents), settings.bm25_k1, settings.bm25_b, settings.show_progress).save(
                str(tmp / "bm25"), show_progress=False
            )
        _write_meta(tmp, corpus, method, settings, time.perf_counter() - t0, source)
        shutil.rmtree(target, ignore_errors=True)  # only there when exporting: the fresh build replaces it
        tmp.replace(target)
        shutil.rmtree(target.with_name(target.name + ".partial"), ignore_errors=True)
        logger.info("built %s index in %.1fs (%s)", method.value, time.perf_counter() - t0, source or "bm25s")
    return target


def _load_one(corpus: Corpus, method: Method, settings: Settings, progress: ProgressFn) -> Retriever:
    if method is Method.dense:
        from retriever_server.retrievers.dense import FaissDenseRetriever, read_faiss_index

        progress("loading encoder", 0, 0)
        encoder = make_encoder(settings)
        if settings.prebuilt_index is not None:
            path = settings.prebuilt_index
        else:
            path = build_index(corpus, method, settings, encoder=encoder, progress=progress) / "index.faiss"
        progress("loading faiss index", 0, 0)
        index = read_faiss_index(path, mmap=settings.index_mmap, rows=len(corpus))
        return FaissDenseRetriever(index, encoder, settings.hnsw_ef_search, settings.ivf_nprobe)
    folder = build_index(corpus, method, settings, progress=progress)
    return BM25Retriever.load(folder / "bm25", len(corpus))


def load_retriever(corpus: Corpus, settings: Settings, progress: ProgressFn = _no_progress) -> Retriever:
    """The retriever for ``settings.method``, building any missing index first (reporting to ``progress``)."""
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
        if settings.method is not Method.bm25:  # BM25 alone needs no FAISS installed
            import faiss

            faiss.omp_set_num_threads(settings.torch_threads)
    if settings.method is Method.hybrid:
        return HybridRetriever(
            _load_one(corpus, Method.dense, settings, progress),
            _load_one(corpus, Method.bm25, settings, progress),
            rrf_k=settings.rrf_k,
            candidates=settings.hybrid_candidates,
        )
    return _load_one(corpus, settings.method, settings, progress)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="corpus jsonl(.gz) with id/contents rows")
    ap.add_argument("--method", choices=["dense", "bm25"], required=True)
    ap.add_argument("--out", type=Path, required=True, help="index cache root (what RETRIEVER_INDEX_DIR points at)")
    ap.add_argument("--encoder", default=None, help="sentence-transformers model (default: settings' encoder)")
    ap.add_argument("--index-factory", default=None, help="FAISS index-factory string, e.g. Flat, HNSW32, IVF4096,PQ64")
    ap.add_argument("--batch-size", type=int, default=None, help="passages per encoder batch")
    ap.add_argument(
        "--export-shipped",
        type=Path,
        default=None,
        metavar="DIR",
        help="dense: encode afresh and also write the embeddings as a shipped float16 set into DIR",
    )
    args = ap.parse_args(argv)
    if args.export_shipped is not None and args.method != "dense":
        ap.error("--export-shipped needs --method dense")
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
    folder = build_index(corpus, settings.method, settings, export_to=args.export_shipped)
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
