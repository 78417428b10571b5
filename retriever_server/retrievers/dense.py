"""Dense retrieval: sentence-transformers embeddings (unit length) in a FAISS inner-product index."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import faiss
import numpy as np

from retriever_server.retrievers.encoder import Encoder

logger = logging.getLogger(__name__)


def build_faiss_index(embeddings: np.ndarray, factory: str, seed: int = 0) -> faiss.Index:
    """Build an inner-product FAISS index from unit vectors with any index-factory string (training if needed)."""
    index = faiss.index_factory(embeddings.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        logger.info("training FAISS index %r on %d vectors", factory, len(embeddings))
        if hasattr(index, "cp"):
            index.cp.seed = seed
        index.train(embeddings)
    index.add(embeddings)
    return index


def read_faiss_index(path: Path, mmap: bool = True, rows: int | None = None) -> faiss.Index:
    """Read a FAISS index file; with ``mmap`` its codes, inverted lists and graph stay in the file's pages (shared
    by every process that maps it) instead of being copied onto the heap.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: ``rows`` is given and the index holds another number of vectors (vector i must be row i).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"FAISS index not found: {path} (RETRIEVER_PREBUILT_INDEX or the index cache)")
    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC if mmap else 0)
    if rows is not None and index.ntotal != rows:
        raise ValueError(
            f"{path}: the index holds {index.ntotal} vectors but the corpus has {rows} rows; vector i must be corpus "
            "row i, so serve the corpus the index was built from (RETRIEVER_CORPUS_PATH)"
        )
    return index


BLAS_QUERY_THRESHOLD = 20
"""Query batches at least this large compute exact inner products as one BLAS matrix product (faiss's historic
default). faiss 1.15 ships 128,000, so a Flat search of a 128-query batch ran its per-query kernel: 155 ms against
17 ms by BLAS on the 2-core reference machine, the same top-10 (docs/experiments/2026-11-27-int8-query-encoder.md)."""


def use_blas_for_query_batches(threshold: int = BLAS_QUERY_THRESHOLD) -> None:
    """Make exact (Flat, and IVF coarse-quantizer) searches of ``threshold`` or more queries use BLAS; process-wide."""
    faiss.cvar.distance_compute_blas_threshold = threshold


def set_search_params(index: faiss.Index, ef_search: int, nprobe: int) -> None:
    """Set efSearch (HNSW) and nprobe (IVF) where the index has them; search-time knobs, not part of the file."""
    params = faiss.ParameterSpace()
    for name, value in (("efSearch", ef_search), ("nprobe", nprobe)):
        with contextlib.suppress(RuntimeError):  # the parameter does not apply to this index type
            params.set_index_parameter(index, name, value)


class FaissDenseRetriever:
    """Encodes queries and searches a FAISS index built over the corpus contents."""

    name = "dense"

    def __init__(self, index: faiss.Index, encoder: Encoder, ef_search: int = 128, nprobe: int = 16) -> None:
        if index.d != encoder.dim:
            raise ValueError(
                f"FAISS index has dimension {index.d} but encoder {encoder.model_name!r} gives {encoder.dim}"
            )
        self.index = index
        self.encoder = encoder
        set_search_params(index, ef_search, nprobe)
        use_blas_for_query_batches()

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product (= cosine) for each query."""
        q = self.encoder.encode_queries(queries)
        scores, positions = self.index.search(q, topk)
        return scores, positions
