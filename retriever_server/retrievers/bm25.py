"""Sparse retrieval: BM25 with bm25s, English stopwords and a Snowball stemmer."""

from __future__ import annotations

import os
from pathlib import Path

# bm25s runs a JAX operation when it is imported wherever JAX is installed; on a GPU machine JAX then takes 75% of the
# GPU's memory (its default preallocation) from the trainer beside the retriever. Top-k selection here is numpy's.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bm25s  # noqa: E402
import numpy as np  # noqa: E402

STOPWORDS = "en"


def _stemmer():  # type: ignore[no-untyped-def]
    import Stemmer

    return Stemmer.Stemmer("english")


def tokenize(texts: list[str], progress: bool = False):  # type: ignore[no-untyped-def]
    """Lower-case, drop English stopwords, stem; the same function indexes and queries."""
    return bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=_stemmer(), show_progress=progress)


def build_bm25(contents: list[str], k1: float, b: float, progress: bool = False) -> bm25s.BM25:
    """Index the corpus contents."""
    model = bm25s.BM25(k1=k1, b=b)
    model.index(tokenize(contents, progress), show_progress=progress)
    return model


class BM25Retriever:
    """BM25 over the corpus. Only documents sharing a term with the query are returned: a query with no known term
    (or only stopwords) gets no documents rather than arbitrary ones with score 0."""

    name = "bm25"

    def __init__(self, model: bm25s.BM25, num_docs: int) -> None:
        self.model = model
        self.num_docs = num_docs
        self._stemmer = _stemmer()

    @classmethod
    def load(cls, directory: Path, num_docs: int) -> BM25Retriever:
        return cls(bm25s.BM25.load(str(directory), show_progress=False), num_docs)

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k BM25 scores per query."""
        k = min(topk, self.num_docs)
        tokens = bm25s.tokenize(
            queries, stopwords=STOPWORDS, stemmer=self._stemmer, return_ids=False, show_progress=False
        )
        positions, scores = self.model.retrieve(
            tokens, k=k, show_progress=False, n_threads=1, backend_selection="numpy"
        )
        positions = np.asarray(positions, dtype=np.int64).reshape(len(queries), k)
        scores = np.asarray(scores, dtype=np.float32).reshape(len(queries), k)
        if k < topk:  # pad to the asked width like FAISS does
            pad = topk - k
            positions = np.pad(positions, ((0, 0), (0, pad)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        # bm25s fills the top-k with score-0 documents when fewer match; BM25 (Lucene idf) is > 0 for any match.
        no_match = scores <= 0
        positions[no_match], scores[no_match] = -1, -np.inf
        return scores, positions
