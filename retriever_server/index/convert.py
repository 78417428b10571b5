"""Build compressed FAISS indexes from vectors that already exist, without re-encoding the corpus.

The vectors come from saved embeddings (a ``.npy`` of float32 or float16 rows, read memory-mapped) or from an
existing index that can give its vectors back, such as Search-R1's ``e5_Flat.index`` (read memory-mapped and
reconstructed in chunks, so a 60 GB Flat index converts on a 24 GB machine). The new index is trained once on a
random sample, then filled chunk by chunk; with ``--shards K`` the same trained index is filled with K consecutive
row ranges, one file each, for the Ray Serve deployment (``retriever_server.serve.deployment``)::

    python -m retriever_server.index.convert --flat-index e5_Flat.index --factory "OPQ64,IVF65536,PQ64" \\
        --out e5_ivfpq.index
    python -m retriever_server.index.convert --vectors emb.npy --factory "IVF4096,SQ8" --out ivf.index --shards 2

Every index is inner product (vectors are unit length); ``nprobe`` / ``efSearch`` stay search-time settings
(``RETRIEVER_IVF_NPROBE``, ``RETRIEVER_HNSW_EF_SEARCH``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

logger = logging.getLogger(__name__)

CHUNK_ROWS = 65_536
"""Rows read, and added to the index, at a time: 192 MB of float32 at 768 dims."""
ProgressFn = Callable[[str, int, int], None]


class VectorSource:
    """Rows of vectors by range, from a ``.npy`` file or an index that can reconstruct its vectors."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"vectors not found: {self.path}")
        self._array: np.ndarray | None = None
        self._index: faiss.Index | None = None
        if self.path.suffix == ".npy":
            self._array = np.load(self.path, mmap_mode="r")
            if self._array.ndim != 2:
                raise ValueError(f"{self.path}: expected a 2-d (rows, dim) array, got shape {self._array.shape}")
            self.ntotal, self.dim = (int(n) for n in self._array.shape)
        else:
            self._index = faiss.read_index(str(self.path), faiss.IO_FLAG_MMAP_IFC)
            ivf = faiss.try_extract_index_ivf(self._index)
            if ivf is not None:
                ivf.make_direct_map()  # IVF indexes reconstruct by id only through a direct map
            self.ntotal, self.dim = int(self._index.ntotal), int(self._index.d)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as contiguous float32, shape (stop - start, dim)."""
        if self._array is not None:
            return np.ascontiguousarray(self._array[start:stop], dtype=np.float32)
        assert self._index is not None
        return self._index.reconstruct_n(start, stop - start)  # type: ignore[no-any-return]

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` distinct rows chosen at random (all rows when ``n`` >= ntotal), as float32."""
        if n >= self.ntotal:
            return self.rows(0, self.ntotal)
        picked = np.sort(np.random.default_rng(seed).choice(self.ntotal, size=n, replace=False))
        if self._array is not None:
            return np.ascontiguousarray(self._array[picked], dtype=np.float32)
        assert self._index is not None
        return np.vstack([self._index.reconstruct(int(i)) for i in picked])


def shard_bounds(ntotal: int, shards: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of nearly equal size.

    >>> shard_bounds(10, 3)
    [(0, 3), (3, 6), (6, 10)]
    """
    if not 1 <= shards <= ntotal:
        raise ValueError(f"cannot cut {ntotal} rows into {shards} shards")
    cuts = np.linspace(0, ntotal, shards + 1).astype(int).tolist()
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def train_index(source: VectorSource, factory: str, train_rows: int, seed: int = 0) -> faiss.Index:
    """An empty inner-product index of ``factory``, trained on a random sample of ``train_rows`` source rows."""
    index = faiss.index_factory(source.dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        sample = source.sample(train_rows, seed)
        logger.info("training %r on %d of %d vectors", factory, len(sample), source.ntotal)
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.cp.seed = seed
        index.train(sample)
    return index


def fill_index(
    index: faiss.Index, source: VectorSource, start: int, stop: int, progress: ProgressFn | None = None
) -> faiss.Index:
    """Add rows ``start:stop`` of ``source`` to ``index`` in chunks of ``CHUNK_ROWS``."""
    for lo in range(start, stop, CHUNK_ROWS):
        index.add(source.rows(lo, min(lo + CHUNK_ROWS, stop)))
        if progress is not None:
            progress("adding vectors", min(lo + CHUNK_ROWS, stop) - start, stop - start)
    return index


def shard_paths(out: Path, shards: int) -> list[Path]:
    """``out`` itself for one shard, else ``<stem>-shard<i>of<K><suffix>`` beside it."""
    if shards == 1:
        return [out]
    return [out.with_name(f"{out.stem}-shard{i}of{shards}{out.suffix}") for i in range(shards)]


def convert(
    source: VectorSource,
    factory: str,
    out: Path,
    train_rows: int = 262_144,
    shards: int = 1,
    progress: ProgressFn | None = None,
) -> list[Path]:
    """Train ``factory`` once on a sample of ``source`` and write one index per shard of its rows; return the files.

    Raises:
        ValueError: ``shards`` is below 1 or above the row count.
    """
    bounds = shard_bounds(source.ntotal, shards)
    trained = train_index(source, factory, train_rows)
    paths = shard_paths(Path(out), shards)
    for (lo, hi), path in zip(bounds, paths, strict=True):
        index = fill_index(faiss.clone_index(trained), source, lo, hi, progress)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        faiss.write_index(index, str(tmp))
        tmp.replace(path)
        logger.info("wrote %s: rows %d-%d of %d (%s)", path, lo, hi, source.ntotal, factory)
    return paths


def write_store_shards(corpus_path: Path, ntotal: int, index_paths: list[Path]) -> list[Path]:
    """Write each shard's rows of the corpus as a store beside its index (``<index stem>.store``).

    Raises:
        ValueError: the corpus row count differs from the vector count.
    """
    from retriever_server.index.corpus import load_corpus
    from retriever_server.index.docstore import slice_store

    corpus = load_corpus(corpus_path)
    if len(corpus) != ntotal:
        raise ValueError(f"{corpus_path} has {len(corpus)} rows but there are {ntotal} vectors; row i must be vector i")
    out = []
    for (lo, hi), path in zip(shard_bounds(ntotal, len(index_paths)), index_paths, strict=True):
        out.append(slice_store(corpus.store, lo, hi, path.with_suffix(".store")).folder)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--vectors", type=Path, help="saved embeddings: a (rows, dim) float32/float16 .npy")
    src.add_argument("--flat-index", type=Path, help="an index whose vectors are reconstructed (e.g. e5_Flat.index)")
    ap.add_argument("--factory", required=True, help='FAISS factory string, e.g. "IVF4096,PQ64", "HNSW32,SQ8"')
    ap.add_argument("--out", type=Path, required=True, help="index file to write (shards get -shard<i>of<K>)")
    ap.add_argument("--train-rows", type=int, default=262_144, help="vectors sampled to train IVF/PQ/SQ")
    ap.add_argument("--shards", type=int, default=1, help="split the rows into this many index files")
    ap.add_argument("--corpus", type=Path, help="with --shards: also write each shard's rows of this corpus as a store")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    source = VectorSource(args.vectors or args.flat_index)
    paths = convert(source, args.factory, args.out, args.train_rows, args.shards)
    if args.corpus is not None:
        write_store_shards(args.corpus, source.ntotal, paths)
    logger.info("built %d index file(s) from %d vectors in %.1fs", len(paths), source.ntotal, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
