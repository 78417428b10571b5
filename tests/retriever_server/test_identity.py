"""What ``GET /health`` reports to identify a server's answers (``retriever_server/identity.py``): the search-time
settings, the corpus hash and an index key that changes with the index. ``python -m pytest
tests/retriever_server/test_identity.py`` (about half a minute: the dense server test loads MiniLM twice).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pytest
from fastapi.testclient import TestClient

from retriever_server.api.app import create_app
from retriever_server.identity import file_sha256, index_identity, search_settings
from retriever_server.index.build import index_path
from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.retrievers.dense import build_faiss_index
from retriever_server.settings import Method, Settings

IVF_PQ = "IVF4,PQ16x4"
"""An IVF-PQ index small enough to train on 300 vectors."""


def settings_for(tmp_path: Path, corpus: Path, **overrides: object) -> Settings:
    return Settings(corpus_path=corpus, index_dir=tmp_path / "cache", show_progress=False, **overrides)  # type: ignore[arg-type]


def write_index(path: Path, factory: str, rows: int = 300) -> Path:
    """A FAISS index of the shipped MiniLM vectors of the first ``rows`` passages."""
    vectors = np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:rows].astype(np.float32)
    faiss.write_index(build_faiss_index(vectors, factory), str(path))
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_search_settings_hold_the_search_time_knobs_of_the_method() -> None:
    assert search_settings(Settings(method=Method.bm25, default_topk=5)) == {"method": "bm25", "default_topk": 5}
    dense = search_settings(Settings(method=Method.dense, encoder_model="intfloat/e5-base-v2", ivf_nprobe=64))
    assert dense == {
        "method": "dense",
        "default_topk": 3,
        "encoder_model": "intfloat/e5-base-v2",
        "encoder_backend": "torch",
        "query_prefix": "query: ",
        "ivf_nprobe": 64,
        "hnsw_ef_search": 128,
    }
    hybrid = search_settings(Settings(method=Method.hybrid, rrf_k=10, hybrid_candidates=20))
    assert hybrid["rrf_k"] == 10 and hybrid["hybrid_candidates"] == 20 and hybrid["query_prefix"] == ""
    assert search_settings(Settings(encoder_model="/home/ann/models/e5-base"))["encoder_model"] == "e5-base"


def test_built_index_key_is_its_cache_folder_and_changes_with_the_factory(tmp_path: Path, small_corpus: Path) -> None:
    corpus = load_corpus(small_corpus, tmp_path / "stores")
    flat, ivfpq = (settings_for(tmp_path, small_corpus, index_factory=f) for f in ("Flat", IVF_PQ))
    assert index_identity(corpus, flat).index_key == index_path(corpus, Method.dense, flat).name
    assert index_identity(corpus, flat).index_key != index_identity(corpus, ivfpq).index_key
    assert index_identity(corpus, flat).corpus_sha256 == sha(small_corpus.read_bytes())
    hybrid = index_identity(corpus, settings_for(tmp_path, small_corpus, method="hybrid"))
    dense_key, bm25_key = hybrid.index_key.split("+")
    assert dense_key.startswith("dense-") and bm25_key.startswith("bm25-")


def test_file_hash_is_cached_beside_the_file_until_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "e5_Flat.index"
    f.write_bytes(os.urandom(3 << 20))
    cache, steps = tmp_path / "cache", []
    assert file_sha256(f, cache, lambda *step: steps.append(step)) == sha(f.read_bytes())
    assert steps[-1] == ("hashing index file", 3 << 20, 3 << 20)
    record_file = tmp_path / "e5_Flat.index.sha256"
    record = json.loads(record_file.read_text())
    assert record == {"size": 3 << 20, "mtime_ns": f.stat().st_mtime_ns, "sha256": sha(f.read_bytes())}

    record_file.write_text(json.dumps({**record, "sha256": "planted"}))
    steps.clear()
    assert file_sha256(f, cache, lambda *step: steps.append(step)) == "planted" and steps == []  # read, not hashed

    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, newer mtime: hashed again
    assert file_sha256(f, cache) == sha(f.read_bytes())
    f.write_bytes(b"another index")
    assert file_sha256(f, cache) == sha(b"another index")


def test_a_foreign_sha256_file_is_left_alone(tmp_path: Path) -> None:
    f = tmp_path / "e5_Flat.index"
    f.write_bytes(b"index bytes")
    sidecar = tmp_path / "e5_Flat.index.sha256"
    sidecar.write_text(f"{sha(b'index bytes')}  e5_Flat.index\n")  # sha256sum's format, someone else's file
    assert file_sha256(f, tmp_path / "cache") == sha(b"index bytes")
    assert sidecar.read_text() == f"{sha(b'index bytes')}  e5_Flat.index\n"
    [cached] = (tmp_path / "cache" / "file-sha256").glob("e5_Flat.index-*.sha256")
    assert json.loads(cached.read_text())["sha256"] == sha(b"index bytes")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_read_only_folder_caches_the_hash_under_the_cache_dir(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    f = folder / "e5_Flat.index"
    f.write_bytes(b"index bytes")
    folder.chmod(0o555)
    try:
        assert file_sha256(f, tmp_path / "cache") == sha(b"index bytes")
        assert not (folder / "e5_Flat.index.sha256").exists()
        assert list((tmp_path / "cache" / "file-sha256").glob("e5_Flat.index-*.sha256"))
    finally:
        folder.chmod(0o755)


def ready_health(client: TestClient, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.get("/health")
        assert r.json()["status"] != "failed", r.json()
        if r.status_code == 200:
            return dict(r.json())
        time.sleep(0.2)
    raise TimeoutError(client.get("/health").json())


@pytest.fixture
def served_health(tmp_path: Path, small_corpus: Path) -> Callable[..., dict]:
    """``served_health(**settings)``: the ``/health`` body of an app over ``small_corpus`` once it is ready."""

    def health(**overrides: object) -> dict:
        with TestClient(create_app(settings_for(tmp_path, small_corpus, cache_size=0, **overrides))) as client:
            return ready_health(client)

    return health


@pytest.mark.slow
def test_flat_and_ivfpq_prebuilt_indexes_report_different_keys(
    tmp_path: Path, served_health: Callable[..., dict]
) -> None:
    flat, ivfpq = write_index(tmp_path / "flat.index", "Flat"), write_index(tmp_path / "ivfpq.index", IVF_PQ)
    a, b = (served_health(prebuilt_index=p, ivf_nprobe=2) for p in (flat, ivfpq))
    assert a["index_key"] == f"prebuilt-{sha(flat.read_bytes())}" and a["index_path"] == "flat.index"
    assert b["index_key"] == f"prebuilt-{sha(ivfpq.read_bytes())}" != a["index_key"]
    assert a["corpus_sha256"] == b["corpus_sha256"] and a["search_settings"] == b["search_settings"]
    assert a["search_settings"]["ivf_nprobe"] == 2 and a["num_documents"] == 300


def test_bm25_health_reports_the_identity(
    served_health: Callable[..., dict], tmp_path: Path, small_corpus: Path
) -> None:
    body = served_health(method="bm25", bm25_k1=1.2)
    corpus = load_corpus(small_corpus, tmp_path / "stores")
    folder = index_path(corpus, Method.bm25, settings_for(tmp_path, small_corpus, method="bm25", bm25_k1=1.2))
    assert body["index_key"] == body["index_path"] == folder.name
    assert body["corpus_sha256"] == sha(small_corpus.read_bytes())
    assert body["search_settings"] == {"method": "bm25", "default_topk": 3}
