"""Query encoder backends: the fp32 ONNX export gives torch's embeddings (cosine >= 0.99 per real question), exports
are cached and reused, settings reach the encoder, and ``auto`` picks the GPU when torch sees one.

    python -m pytest -q tests/retriever_server/retrievers/test_encoder_backends.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from data_prep.build_default_dataset import DEFAULT_OUT
from data_prep.rows import read_rows
from retriever_server.index.build import make_encoder
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.retrievers import onnx_encoder
from retriever_server.retrievers.encoder import Encoder, encoder_fingerprint, resolve_device
from retriever_server.settings import DEFAULT_ENCODER, EncoderBackend, Settings

pytest.importorskip("onnxruntime", reason="the ONNX backends need onnxruntime (pip install -e .)")


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
    return Encoder(DEFAULT_ENCODER).encode_queries(questions)


@pytest.fixture(scope="module")
def onnx_encoder_(index_dir: Path) -> Encoder:
    settings = Settings(encoder_backend="onnx", encoder_threads=1, index_dir=index_dir, show_progress=False)
    return make_encoder(settings)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 16])
def test_onnx_matches_torch(
    onnx_encoder_: Encoder, torch_embeddings: np.ndarray, questions: list[str], batch_size: int
) -> None:
    got = onnx_encoder_.encode_queries(questions, batch_size=batch_size)
    assert got.dtype == np.float32 and got.shape == torch_embeddings.shape and got.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosine = (got * torch_embeddings).sum(axis=1)
    assert cosine.min() >= 0.99, f"question {int(cosine.argmin())}: cosine {cosine.min():.4f} to torch's embedding"


@pytest.mark.slow
def test_settings_reach_the_onnx_encoder(onnx_encoder_: Encoder, index_dir: Path) -> None:
    assert onnx_encoder_.backend is EncoderBackend.onnx and onnx_encoder_.dim == 384
    assert onnx_encoder_._queries.session.get_session_options().intra_op_num_threads == 1
    (export,) = (index_dir / "encoders").iterdir()  # no temporary folder left beside it
    assert export.name.startswith("onnx-") and (export / "export.json").is_file()


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
    torch_recall, int8_recall = recall(Encoder(DEFAULT_ENCODER)), recall(int8)
    assert torch_recall > 0.5  # the questions and vectors are the shipped ones, not noise
    assert abs(int8_recall - torch_recall) <= 0.01, f"int8 {int8_recall:.3f} vs torch {torch_recall:.3f}"
