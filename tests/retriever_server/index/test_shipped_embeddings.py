"""Shipped embeddings: the set in data/index belongs to the shipped corpus and encoder; a matching set is used instead
of encoding; a set that does not match (other corpus, other encoder, damaged part, wrong vectors) is not, and the log
says why. Run: python -m pytest tests/retriever_server/index/test_shipped_embeddings.py -q
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from retriever_server.index.build import build_index, load_retriever
from retriever_server.index.corpus import Corpus, load_corpus
from retriever_server.index.shipped_embeddings import (
    MIN_SPOT_COSINE,
    SHIPPED_EMBEDDINGS_DIR,
    encoder_fingerprint,
    find_set,
    load_set,
)
from retriever_server.retrievers.encoder import Encoder
from retriever_server.settings import DEFAULT_ENCODER, SHIPPED_CORPUS, Method, Settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(DEFAULT_ENCODER)


def settings_for(tmp_path: Path, corpus: Path, name: str = "idx") -> Settings:
    return Settings(corpus_path=corpus, index_dir=tmp_path / name, show_progress=False, encode_batch_size=8)  # type: ignore[arg-type]


def build(corpus: Corpus, s: Settings, encoder: Encoder, **kw: object) -> tuple[Path, list[str]]:
    """Build the dense index; return its folder and the progress stages it reported."""
    stages: list[str] = []
    folder = build_index(corpus, Method.dense, s, encoder, progress=lambda st, d, t: stages.append(st), **kw)  # type: ignore[arg-type]
    return folder, stages


def test_shipped_set_matches_the_shipped_corpus_and_encoder(encoder: Encoder) -> None:
    corpus = load_corpus(SHIPPED_CORPUS)
    folder = find_set(corpus)
    assert folder is not None and folder.parent == SHIPPED_EMBEDDINGS_DIR
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    assert manifest["encoder"]["fingerprint"] == encoder_fingerprint(DEFAULT_ENCODER)
    for part in manifest["parts"]:
        assert (folder / part["file"]).stat().st_size < 5_000_000, part["file"]
    embeddings = load_set(folder, corpus, Settings(), encoder)  # checks hashes, shape and a spot check
    assert embeddings.shape == (len(corpus), encoder.dim)
    rows = np.random.default_rng(0).choice(len(corpus), size=16, replace=False)
    fresh = encoder.encode_passages([corpus.contents[i] for i in rows])
    assert (fresh * embeddings[rows]).sum(axis=1).min() >= MIN_SPOT_COSINE


def test_a_matching_set_replaces_encoding(tmp_path: Path, make_corpus: Callable[[int], Path], encoder: Encoder) -> None:
    corpus = load_corpus(make_corpus(24))
    exported, stages = build(corpus, settings_for(tmp_path, corpus.path, "a"), encoder, export_to=tmp_path / "sets/x")
    assert "encoding corpus" in stages
    folder, stages = build(corpus, settings_for(tmp_path, corpus.path, "b"), encoder, shipped_root=tmp_path / "sets")
    assert "encoding corpus" not in stages and "checking shipped embeddings" in stages
    assert json.loads((folder / "meta.json").read_text())["embeddings"].startswith("shipped float16 set")
    retriever = load_retriever(corpus, settings_for(tmp_path, corpus.path, "b"))
    _, positions = retriever.search(corpus.contents, 1)
    assert positions[:, 0].tolist() == list(range(len(corpus)))  # every passage finds itself first
    assert json.loads((exported / "meta.json").read_text())["embeddings"] == f"encoded by {DEFAULT_ENCODER}"


def _flip_a_value(folder: Path) -> None:
    part = folder / "embeddings-000.npy"
    emb = np.load(part)
    emb[0, 0] = -emb[0, 0]
    np.save(part, emb)


def _other_encoder(folder: Path) -> None:
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    manifest["encoder"]["fingerprint"] = "0" * 64
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))


def _wrong_vectors(folder: Path) -> None:
    """Valid files and hashes, but vectors that are not the passages' (a stale export, a different encoder)."""
    from retriever_server.passages import file_sha256

    part = folder / "embeddings-000.npy"
    emb = np.load(part)
    np.save(part, np.roll(emb, 1, axis=0))
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    manifest["parts"][0]["sha256"] = file_sha256(part)
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_flip_a_value, "has a different sha256 than MANIFEST.json records"),
        (_other_encoder, "encoder fingerprint differs"),
        (_wrong_vectors, "re-encoded passages differ from the shipped vectors"),
    ],
)
def test_a_set_that_does_not_match_is_rebuilt_by_encoding(
    tmp_path: Path,
    make_corpus: Callable[[int], Path],
    encoder: Encoder,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
    reason: str,
) -> None:
    corpus = load_corpus(make_corpus(24))
    build(corpus, settings_for(tmp_path, corpus.path, "a"), encoder, export_to=tmp_path / "sets/x")
    damage(tmp_path / "sets/x")
    with caplog.at_level(logging.WARNING, logger="retriever_server.index.shipped_embeddings"):
        folder, stages = build(
            corpus, settings_for(tmp_path, corpus.path, "b"), encoder, shipped_root=tmp_path / "sets"
        )
    assert "encoding corpus" in stages
    assert json.loads((folder / "meta.json").read_text())["embeddings"] == f"encoded by {DEFAULT_ENCODER}"
    assert reason in caplog.text and str(tmp_path / "sets/x") in caplog.text


def test_a_set_of_another_corpus_is_not_looked_at(
    tmp_path: Path, make_corpus: Callable[[int], Path], encoder: Encoder
) -> None:
    corpus = load_corpus(make_corpus(24))
    build(corpus, settings_for(tmp_path, corpus.path, "a"), encoder, export_to=tmp_path / "sets/x")
    other = load_corpus(make_corpus(25))
    assert find_set(corpus, tmp_path / "sets") == tmp_path / "sets/x"
    assert find_set(other, tmp_path / "sets") is None
    _, stages = build(other, settings_for(tmp_path, other.path, "b"), encoder, shipped_root=tmp_path / "sets")
    assert "encoding corpus" in stages
