"""Query encoder backends: the fp32 ONNX export, built as the server builds it (``make_encoder`` with no thread
setting, so onnxruntime's default of one thread per physical core), gives torch's embeddings (cosine >= 0.99997 per
question) and embeds a query alone as in a batch (within ``BATCH_ATOL``); exports are cached and reused, settings reach
the encoder, the ``auto`` device picks the GPU when torch sees one, and the ``auto`` backend picks the fp32 export only
for the checked encoder on CPU.

    python -m pytest -q tests/retriever_server/retrievers/test_encoder_backends.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from numerics import reorder_tol

from data_prep.build_default_dataset import DEFAULT_OUT
from data_prep.rows import read_rows
from retriever_server.index.build import make_encoder
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.retrievers import encoder as encoder_module
from retriever_server.retrievers import onnx_encoder
from retriever_server.retrievers.encoder import (
    Encoder,
    default_export_cache,
    encoder_fingerprint,
    resolve_backend,
    resolve_device,
)
from retriever_server.settings import DEFAULT_ENCODER, EncoderBackend, Settings

pytest.importorskip("onnxruntime", reason="the ONNX backends need onnxruntime (pip install -e .)")

ENCODER_TERMS = 1536
"""The longest sum behind an embedding component: MiniLM's MLP width (its hidden size is 384, a query ~20 tokens)."""

BATCH_ATOL = reorder_tol(ENCODER_TERMS)
"""How far a query's embedding may move with its batch mates: two orders of ``ENCODER_TERMS``-term fp32 sums at the
scale of a unit vector's components, 1.0 (3.7e-4; tests/numerics.py). Batching changes only the order and blocking of
the sums (padding to the batch's longest query, the kernels' tiling over rows and threads; measured: 4.5e-8). A real
dependence on the batch, like int8's per-batch activation scales, moves components by ~1e-2 (docs/retriever.md)."""

MIN_COSINE_TO_TORCH = 1 - 384 * BATCH_ATOL**2 / 2
"""The fp32 export runs torch's graph in fp32, so only the order of its sums separates the two: 384 components each
``BATCH_ATOL`` off put two unit vectors' cosine at least ``1 - 384 * BATCH_ATOL**2 / 2`` (0.99997; measured:
1 - 3.6e-7)."""

UNIT_NORM_ATOL = reorder_tol(384)
"""How far an embedding's computed norm may lie from 1: the norm sums 384 squares (tests/numerics.py)."""


@pytest.fixture(scope="module")
def questions() -> list[str]:
    rows = read_rows(DEFAULT_OUT / "nq_hotpotqa_mini" / "test.parquet")
    questions = [r["question"] for _, r in zip(range(96), rows, strict=False)]
    # one-token and past-max_seq_length (256 tokens) inputs: padding and truncation must match sentence-transformers
    return [*questions, "x", " ".join(questions)]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="module")
def torch_embeddings(questions: list[str]) -> np.ndarray:
    return Encoder(DEFAULT_ENCODER, backend="torch").encode_queries(questions)


@pytest.fixture(scope="module")
def onnx_encoder_(index_dir: Path) -> Encoder:
    """The fp32 export as the server runs it: ``make_encoder`` with no ``RETRIEVER_*_THREADS`` set (the default), its
    export cached in this module's folder instead of the user cache."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("RETRIEVER_ENCODER_THREADS", "RETRIEVER_TORCH_THREADS"):
            mp.delenv(name, raising=False)
        mp.setattr(encoder_module, "default_export_cache", lambda: index_dir / "encoders")
        return make_encoder(Settings(_env_file=None, encoder_backend="onnx", index_dir=index_dir, show_progress=False))


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 16])
def test_onnx_matches_torch(
    onnx_encoder_: Encoder, torch_embeddings: np.ndarray, questions: list[str], batch_size: int
) -> None:
    got = onnx_encoder_.encode_queries(questions, batch_size=batch_size)
    assert got.dtype == np.float32 and got.shape == torch_embeddings.shape and got.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=UNIT_NORM_ATOL)
    cosine = (got * torch_embeddings).sum(axis=1)
    assert cosine.min() >= MIN_COSINE_TO_TORCH, (
        f"question {int(cosine.argmin())}: cosine {cosine.min():.7f} to torch's embedding"
    )


@pytest.mark.slow
def test_onnx_encoder_is_exported_into_its_cache(onnx_encoder_: Encoder, index_dir: Path) -> None:
    assert onnx_encoder_.backend is EncoderBackend.onnx and onnx_encoder_.dim == 384
    options = onnx_encoder_._queries.session.get_session_options()
    assert options.intra_op_num_threads == 0  # the server's default: onnxruntime's, one thread per physical core
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"  # idle threads yield the cores
    (export,) = (index_dir / "encoders").iterdir()  # no temporary folder left beside it
    assert export.name.startswith("onnx-") and (export / "export.json").is_file()


@pytest.mark.slow
def test_settings_reach_the_encoder_and_exports_are_shared_by_index_folders(tmp_path: Path) -> None:
    """The default (``auto``) runs the shipped MiniLM's fp32 export from the user cache, whatever the index folder."""
    first = make_encoder(Settings(encoder_threads=1, index_dir=tmp_path / "a", show_progress=False))
    assert first.backend is EncoderBackend.onnx
    assert first._queries.session.get_session_options().intra_op_num_threads == 1
    fingerprint = encoder_fingerprint(DEFAULT_ENCODER)
    assert fingerprint is not None
    assert (onnx_encoder.export_dir(default_export_cache(), "onnx", fingerprint) / "export.json").is_file()
    assert not (tmp_path / "a").exists()  # nothing written into the index folder
    torch_settings = Settings(encoder_backend="torch", index_dir=tmp_path / "b", show_progress=False)
    assert make_encoder(torch_settings).backend is EncoderBackend.torch


def test_auto_backend_is_onnx_only_for_the_checked_encoder_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_backend("auto", DEFAULT_ENCODER, "cpu") is EncoderBackend.onnx
    assert resolve_backend("auto", "sentence-transformers/all-MiniLM-L6-v2", "cpu") is EncoderBackend.onnx
    assert resolve_backend("auto", "intfloat/e5-base-v2", "cpu") is EncoderBackend.torch  # recall not checked
    assert resolve_backend("auto", DEFAULT_ENCODER, "cuda") is EncoderBackend.torch  # ONNX backends are CPU-only
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend("auto", DEFAULT_ENCODER, "auto") is EncoderBackend.torch  # the GPU, as Search-R1's
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend("auto", DEFAULT_ENCODER, "auto") is EncoderBackend.onnx
    for named in ("torch", "onnx", "onnx-int8"):
        assert resolve_backend(named, "intfloat/e5-base-v2", "cuda") is EncoderBackend(named)


def test_auto_backend_falls_back_to_torch_without_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name))
    assert resolve_backend("auto", DEFAULT_ENCODER, "cpu") is EncoderBackend.torch


@pytest.mark.slow
def test_onnx_embeddings_do_not_depend_on_the_batch(onnx_encoder_: Encoder, questions: list[str]) -> None:
    """Why ``auto`` picks ``onnx`` and not ``onnx-int8``: a query's embedding alone, in a batch and in another order
    differs by rounding only (``BATCH_ATOL``), so a server's answer to one request can change with the requests
    batched with it only where two passages' scores differ by less than that rounding."""
    some = questions[:24]
    batched = onnx_encoder_.encode_queries(some, batch_size=24)
    alone = np.concatenate([onnx_encoder_.encode_queries([q], batch_size=1) for q in some])
    reordered = onnx_encoder_.encode_queries(some[::-1], batch_size=24)[::-1]
    np.testing.assert_allclose(alone, batched, rtol=0, atol=BATCH_ATOL)
    np.testing.assert_allclose(reordered, batched, rtol=0, atol=BATCH_ATOL)


@pytest.mark.slow
def test_export_is_reused(onnx_encoder_: Encoder, index_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_export(*args: object) -> None:
        raise AssertionError("exported again although a cached export exists")

    monkeypatch.setattr(onnx_encoder, "_export_fp32", no_export)
    again = Encoder(DEFAULT_ENCODER, backend="onnx", cache_dir=index_dir / "encoders")
    assert again.encode_queries(["who wrote the iliad"]).shape == (1, 384)


def test_export_folder_is_keyed_by_weights_and_backend(tmp_path: Path) -> None:
    fingerprint = encoder_fingerprint(DEFAULT_ENCODER)
    assert fingerprint is not None
    folders = {onnx_encoder.export_dir(tmp_path, b, f) for b in ("onnx", "onnx-int8") for f in (fingerprint, "0" * 64)}
    assert len(folders) == 4


def test_auto_device_picks_cuda_when_torch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cuda:1") == "cuda:1"


def test_onnx_backend_refuses_a_gpu_device(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runs on CPU.*encoder_backend=torch"):
        Encoder(DEFAULT_ENCODER, backend="onnx", device="cuda", cache_dir=tmp_path)


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="onnx-int8"):
        Encoder(DEFAULT_ENCODER, backend="tensorrt")


def test_backend_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(_env_file=None).encoder_backend is EncoderBackend.auto
    monkeypatch.setenv("RETRIEVER_ENCODER_BACKEND", "onnx-int8")
    monkeypatch.setenv("RETRIEVER_ENCODER_THREADS", "2")
    s = Settings(_env_file=None)
    assert s.encoder_backend is EncoderBackend.onnx_int8 and s.encoder_threads == 2
    monkeypatch.setenv("RETRIEVER_ENCODER_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match="onnx-int8"):
        Settings(_env_file=None)


@pytest.mark.slow
def test_int8_keeps_the_answer_recall_of_torch(index_dir: Path) -> None:
    """The int8 export's gate (docs/retriever.md): over the 600 shipped test questions against the shipped corpus's
    vectors (exact search), answer recall@3 within 0.01 of torch's."""
    from data_prep.ceiling import has_answer
    from retriever_server.index.corpus import load_corpus
    from retriever_server.settings import SHIPPED_CORPUS

    rows = list(read_rows(DEFAULT_OUT / "nq_hotpotqa_mini" / "test.parquet"))
    questions = [r["question"] for r in rows]
    answers = [list(r["reward_model"]["ground_truth"]["target"]) for r in rows]
    parts = sorted((SHIPPED_EMBEDDINGS_DIR / "wiki_mini").glob("embeddings-*.npy"))
    vectors = np.concatenate([np.load(p) for p in parts]).astype(np.float32)  # (N, 384)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    contents = load_corpus(SHIPPED_CORPUS).contents

    def recall(encoder: Encoder) -> float:
        top = np.argsort(-(encoder.encode_queries(questions) @ vectors.T), axis=1)[:, :3]  # (Q, 3)
        return float(
            np.mean([has_answer([contents[int(i)] for i in row], a) for row, a in zip(top, answers, strict=True)])
        )

    int8 = Encoder(DEFAULT_ENCODER, backend="onnx-int8", threads=1, cache_dir=index_dir / "encoders")
    torch_recall, int8_recall = recall(Encoder(DEFAULT_ENCODER, backend="torch")), recall(int8)
    assert torch_recall > 0.5  # the questions and vectors are the shipped ones, not noise
    assert abs(int8_recall - torch_recall) <= 0.01, f"int8 {int8_recall:.3f} vs torch {torch_recall:.3f}"
