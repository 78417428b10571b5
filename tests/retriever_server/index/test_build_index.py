"""Index building and the on-disk cache: ``python -m pytest tests/retriever_server/index/test_build_index.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import retriever_server.index.build as build_index_mod
from retriever_server.index.build import build_index, index_path, load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.retrievers.encoder import Encoder
from retriever_server.settings import Method, Settings


def settings_for(tmp_path: Path, corpus: Path, **kw: object) -> Settings:
    return Settings(corpus_path=corpus, index_dir=tmp_path / "idx", show_progress=False, **kw)  # type: ignore[arg-type]


def test_cache_key_follows_corpus_and_settings(
    tmp_path: Path, small_corpus: Path, make_corpus: Callable[[int], Path]
) -> None:
    corpus = load_corpus(small_corpus)
    base = settings_for(tmp_path, small_corpus)
    dense = index_path(corpus, Method.dense, base)
    assert dense == index_path(corpus, Method.dense, settings_for(tmp_path, small_corpus, ivf_nprobe=3))
    assert dense != index_path(corpus, Method.dense, settings_for(tmp_path, small_corpus, index_factory="HNSW32"))
    assert dense != index_path(corpus, Method.dense, settings_for(tmp_path, small_corpus, encoder_model="other"))
    bm25 = index_path(corpus, Method.bm25, base)
    assert bm25 != index_path(corpus, Method.bm25, settings_for(tmp_path, small_corpus, bm25_k1=1.2))
    changed = make_corpus(301)
    assert index_path(load_corpus(changed), Method.bm25, base) != bm25


def test_second_load_reuses_the_index_and_a_changed_corpus_reindexes(
    tmp_path: Path, small_corpus: Path, make_corpus: Callable[[int], Path]
) -> None:
    s = settings_for(tmp_path, small_corpus, method="bm25")
    corpus = load_corpus(small_corpus)
    folder = build_index(corpus, Method.bm25, s)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["num_documents"] == 300 and meta["method"] == "bm25"
    stamp = (folder / "meta.json").stat().st_mtime_ns
    assert build_index(corpus, Method.bm25, s) == folder
    assert (folder / "meta.json").stat().st_mtime_ns == stamp  # not rebuilt

    changed = make_corpus(310)
    corpus2 = load_corpus(changed)
    folder2 = build_index(corpus2, Method.bm25, s)
    assert folder2 != folder
    scores, positions = load_retriever(corpus2, s).search([corpus2.contents[305][:200]], 1)
    assert positions[0, 0] == 305  # the new rows are searchable


@pytest.mark.slow
def test_interrupted_dense_build_resumes_from_saved_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_corpus: Callable[[int], Path]
) -> None:
    corpus_file = make_corpus(40)
    corpus = load_corpus(corpus_file)
    s = settings_for(tmp_path, corpus_file)
    monkeypatch.setattr(build_index_mod, "EMBED_CHUNK", 10)
    encoder = Encoder(s.encoder_model)
    calls: list[int] = []
    real_encode = encoder.encode_passages

    def crash_on_third_chunk(texts: list[str], batch_size: int = 128, progress: bool = False) -> np.ndarray:
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt  # stands in for Ctrl-C / a killed process mid-build
        return real_encode(texts, batch_size, progress)

    monkeypatch.setattr(encoder, "encode_passages", crash_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, Method.dense, s, encoder=encoder)
    target = index_path(corpus, Method.dense, s)
    assert not target.exists()
    assert len(list(target.with_name(target.name + ".partial").glob("emb-*.npy"))) == 2

    calls.clear()

    def count_calls(texts: list[str], batch_size: int = 128, progress: bool = False) -> np.ndarray:
        calls.append(len(texts))
        return real_encode(texts, batch_size, progress)

    monkeypatch.setattr(encoder, "encode_passages", count_calls)
    folder = build_index(corpus, Method.dense, s, encoder=encoder)
    assert calls == [10, 10]  # only the two missing chunks were encoded
    assert not target.with_name(target.name + ".partial").exists()
    retriever = load_retriever(corpus, s)
    _, positions = retriever.search([corpus.contents[i] for i in range(40)], 1)
    assert positions[:, 0].tolist() == list(range(40))  # every passage finds itself first
    assert (folder / "index.faiss").exists()


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["HNSW16", "IVF4,Flat"])
def test_other_faiss_factories(tmp_path: Path, factory: str, make_corpus: Callable[[int], Path]) -> None:
    corpus_file = make_corpus(60)
    corpus = load_corpus(corpus_file)
    s = settings_for(tmp_path, corpus_file, index_factory=factory, ivf_nprobe=4)
    retriever = load_retriever(corpus, s)
    scores, positions = retriever.search([corpus.contents[7], corpus.contents[42]], 3)
    assert positions[:, 0].tolist() == [7, 42]
    assert np.all(np.diff(scores, axis=1) <= 0)  # FAISS returns each query's hits sorted by their own scores


@pytest.mark.slow
def test_hybrid_fuses_dense_and_bm25(tmp_path: Path, small_corpus: Path) -> None:
    s = settings_for(tmp_path, small_corpus, method="hybrid", hybrid_candidates=10)
    corpus = load_corpus(small_corpus)
    retriever = load_retriever(corpus, s)
    scores, positions = retriever.search([corpus.contents[123]], 5)
    assert positions[0, 0] == 123
    assert scores[0, 0] == pytest.approx(2 / 61)  # rank 1 in both rankings with rrf_k=60
    assert sorted((tmp_path / "idx").glob("*-*"))  # both component indexes cached


def test_e5_encoders_get_query_and_passage_prefixes(tmp_path: Path) -> None:
    s = Settings(encoder_model="intfloat/e5-base-v2")
    assert s.resolved_prefixes() == ("query: ", "passage: ")
    assert Settings().resolved_prefixes() == ("", "")
    assert Settings(encoder_model="e5-small", query_prefix="").resolved_prefixes() == ("", "passage: ")


def test_a_bm25_server_needs_neither_faiss_nor_jax_on_the_gpu(tmp_path: Path, small_corpus: Path) -> None:
    # The GPU check's machine has no FAISS; JAX there would take 75% of the GPU when bm25s imports it.
    code = (
        "import os, sys; sys.modules['faiss'] = None\n"
        "from pathlib import Path\n"
        "import retriever_server.api.app\n"
        "from retriever_server.index.build import load_retriever\n"
        "from retriever_server.index.corpus import load_corpus\n"
        "from retriever_server.settings import Settings\n"
        f"s = Settings(corpus_path=Path({str(small_corpus)!r}), index_dir=Path({str(tmp_path / 'idx')!r}),"
        " method='bm25', show_progress=False, torch_threads=1)\n"
        "retriever = load_retriever(load_corpus(s.corpus_path), s)\n"
        "positions, scores = retriever.search(['passage'], 2)\n"
        "print(os.environ['JAX_PLATFORMS'], positions.shape, 'faiss' in sys.modules and sys.modules['faiss'] is None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "(1,", "2)", "True"]
