"""Compressed indexes built from saved vectors, a Flat index converted, shards, and memory-mapped loading, all on real
FAISS over real MiniLM vectors (5,000 rows of the shipped embeddings):
``python -m pytest tests/retriever_server/index/test_index_convert.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest
from numerics import assert_same_top_k, reorder_tol

from retriever_server.index.convert import VectorSource, convert, main, shard_bounds
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.retrievers.dense import read_faiss_index
from retriever_server.retrievers.sharded import ShardedIndex

ROWS = 5000


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5,000 unit MiniLM passage vectors saved as float16 (like the shipped set), and queries made from them."""
    half = np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:ROWS]
    path = tmp_path_factory.mktemp("vec") / "emb.npy"
    np.save(path, half)
    return path


def queries(vectors: Path, n: int = 200) -> np.ndarray:
    """Perturbed copies of stored vectors, unit length: near neighbours exist but are not exact copies."""
    x = np.load(vectors).astype(np.float32)[np.arange(0, ROWS, ROWS // n)]
    x += np.random.default_rng(1).normal(scale=0.03, size=x.shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def recall_at_10(index: faiss.Index, exact: np.ndarray, q: np.ndarray) -> float:
    _, found = index.search(q, 10)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)]))


@pytest.mark.parametrize(
    ("factory", "floor"),
    [
        ("IVF64,SQ8", 0.95),
        pytest.param("IVF64,PQ32x4", 0.42, marks=pytest.mark.slow),  # PQ training: ~25 s on 2 cores
        ("HNSW16,SQ8", 0.95),
        ("SQfp16", 0.99),
    ],
)
def test_compressed_index_from_saved_vectors(vectors: Path, tmp_path: Path, factory: str, floor: float) -> None:
    (flat,) = convert(VectorSource(vectors), "Flat", tmp_path / "flat.index")
    (path,) = convert(VectorSource(vectors), factory, tmp_path / "c.index", train_rows=4000)
    q = queries(vectors)
    _, exact = read_faiss_index(flat).search(q, 10)
    index = read_faiss_index(path, rows=ROWS)
    assert index.ntotal == ROWS and path.stat().st_size < flat.stat().st_size
    params = faiss.ParameterSpace()
    if "IVF" in factory:
        params.set_index_parameter(index, "nprobe", 1)
        low = recall_at_10(index, exact, q)
        params.set_index_parameter(index, "nprobe", 64)  # every list: only the quantisation error is left
        assert recall_at_10(index, exact, q) > low
    if "HNSW" in factory:
        params.set_index_parameter(index, "efSearch", 128)
    assert recall_at_10(index, exact, q) >= floor


def test_flat_index_converts_by_reconstructing_its_vectors(vectors: Path, tmp_path: Path) -> None:
    flat = faiss.IndexFlatIP(384)  # written the way Search-R1 writes e5_Flat.index
    flat.add(np.load(vectors).astype(np.float32))
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    source = VectorSource(tmp_path / "e5_Flat.index")
    assert (source.ntotal, source.dim) == (ROWS, 384)
    assert np.array_equal(source.rows(10, 20), np.load(vectors)[10:20].astype(np.float32))
    assert main(["--flat-index", str(tmp_path / "e5_Flat.index"), "--factory", "IVF32,SQ8", "--out",
                 str(tmp_path / "ivf.index"), "--train-rows", "3000"]) == 0  # fmt: skip
    index = read_faiss_index(tmp_path / "ivf.index")
    faiss.ParameterSpace().set_index_parameter(index, "nprobe", 32)
    q = queries(vectors)
    assert recall_at_10(index, flat.search(q, 10)[1], q) >= 0.95
    # an IVF index converts too (its vectors come back through a direct map)
    assert VectorSource(tmp_path / "ivf.index").rows(0, 5).shape == (5, 384)


def test_shards_merge_to_the_single_index_top_k(vectors: Path, tmp_path: Path) -> None:
    paths = convert(VectorSource(vectors), "Flat", tmp_path / "flat.index", shards=2)
    assert [p.name for p in paths] == ["flat-shard0of2.index", "flat-shard1of2.index"]
    (single,) = convert(VectorSource(vectors), "Flat", tmp_path / "one.index")
    shards = [read_faiss_index(p) for p in paths]
    assert [s.ntotal for s in shards] == [2500, 2500]
    q = queries(vectors)
    merged_scores, merged = ShardedIndex(shards, [0, 2500]).search(q, 10)
    scores, positions = read_faiss_index(single).search(q, 10)
    # each shard's BLAS blocks the 384-term inner products of unit vectors its own way (tests/numerics.py)
    assert_same_top_k(merged, merged_scores, positions, scores, reorder_tol(q.shape[1]))
    assert (merged >= 2500).any() and (merged < 2500).any()  # both shards contribute


def test_mmap_keeps_the_index_off_the_heap(vectors: Path, tmp_path: Path) -> None:
    big = np.tile(np.load(vectors).astype(np.float32), (4, 1))  # 20,000 x 384 float32 = 29 MiB
    flat = faiss.IndexFlatIP(384)
    flat.add(big)
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    probe = (
        "import sys, numpy as np; from retriever_server.retrievers.dense import read_faiss_index\n"
        "i = read_faiss_index(sys.argv[1], mmap=sys.argv[2] == '1'); i.search(np.ones((1, 384), 'float32'), 3)\n"
        "print([int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('RssAnon')][0])"
    )

    def anon_kib(mmap: bool) -> int:
        out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "flat.index"), str(int(mmap))],
                             capture_output=True, text=True, check=True)  # fmt: skip
        return int(out.stdout.strip())

    assert anon_kib(False) - anon_kib(True) > 25 * 1024  # the 29 MiB of vectors are file pages, not private memory


def test_bad_inputs_say_what_is_wrong(vectors: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "flat.npy", np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match=r"expected a 2-d \(rows, dim\) array"):
        VectorSource(tmp_path / "flat.npy")
    with pytest.raises(ValueError, match="cannot cut 3 rows into 4 shards"):
        shard_bounds(3, 4)
    (path,) = convert(VectorSource(vectors), "Flat", tmp_path / "flat.index")
    with pytest.raises(ValueError, match="holds 5000 vectors but the corpus has 4999 rows"):
        read_faiss_index(path, rows=4999)
    with pytest.raises(FileNotFoundError, match="RETRIEVER_PREBUILT_INDEX"):
        read_faiss_index(tmp_path / "none.index")
