"""Serving a prebuilt FAISS index and a Search-R1-format corpus as they are (``RETRIEVER_PREBUILT_INDEX``), through a
real uvicorn server: ``python -m pytest tests/retriever_server/index/test_prebuilt.py``.

The index is written the way Search-R1's ``index_builder.py`` writes ``e5_Flat.index`` (a plain ``IndexFlatIP`` of
unit passage vectors, row i = corpus line i), here with the shipped MiniLM vectors of the first 300 passages.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest

from retriever_server.index.build import load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROWS = 300


def rows_of(corpus: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines()]


def search_r1_index(folder: Path, vectors: int = ROWS) -> Path:
    """Search-R1's index layout: a plain IndexFlatIP of the first ``vectors`` passages' unit vectors."""
    index = faiss.IndexFlatIP(384)
    index.add(np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:vectors].astype(np.float32))
    faiss.write_index(index, str(folder / "e5_Flat.index"))
    return folder / "e5_Flat.index"


def test_prebuilt_index_is_served_as_is(tmp_path: Path, make_corpus: Callable[[int], Path]) -> None:
    corpus, index = make_corpus(ROWS), search_r1_index(tmp_path)
    rows = rows_of(corpus)
    env = {
        "RETRIEVER_CORPUS_PATH": str(corpus),
        "RETRIEVER_PREBUILT_INDEX": str(index),
        "RETRIEVER_INDEX_DIR": str(tmp_path / "cache"),
        "RETRIEVER_CACHE_SIZE": "0",
    }
    with RetrieverProcess(env=env, ready_timeout_s=300, log_path=tmp_path / "server.log") as server:
        health = httpx.get(f"{server.url}/health").json()
        assert health["num_documents"] == ROWS and health["index_path"] == "e5_Flat.index"
        picks = [5, 123, 299]
        queries = [rows[i]["contents"] for i in picks]
        body = httpx.post(f"{server.url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}).json()
    assert [r[0]["document"] for r in body["result"]] == [rows[i] for i in picks]  # a passage finds itself
    assert all(r[0]["score"] > 0.99 for r in body["result"])
    assert not list((tmp_path / "cache").glob("dense-*")), "nothing is built for a prebuilt index"


def test_row_count_mismatch_is_refused_by_name(tmp_path: Path, make_corpus: Callable[[int], Path]) -> None:
    corpus, index = make_corpus(ROWS), search_r1_index(tmp_path, vectors=ROWS - 1)
    settings = Settings(corpus_path=corpus, prebuilt_index=index, index_dir=tmp_path / "cache", show_progress=False)
    with pytest.raises(ValueError, match="index holds 299 vectors but the corpus has 300 rows"):
        load_retriever(load_corpus(corpus, settings.docstore_root()), settings)


def test_encoder_dimension_mismatch_is_refused(tmp_path: Path, make_corpus: Callable[[int], Path]) -> None:
    corpus = make_corpus(10)
    index = faiss.IndexFlatIP(768)  # an e5-base index served with a 384-dim encoder
    index.add(np.eye(10, 768, dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "e5.index"))
    settings = Settings(corpus_path=corpus, prebuilt_index=tmp_path / "e5.index", index_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="dimension 768 but encoder 'all-MiniLM-L6-v2' gives 384"):
        load_retriever(load_corpus(corpus, settings.docstore_root()), settings)
