"""The interface every retrieval backend implements."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Retriever(Protocol):
    """Ranks corpus positions for a batch of queries."""

    name: str

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(scores, positions)``, both ``(len(queries), topk)``, best first.

        ``positions`` index the corpus rows; -1 marks a slot with no document (fewer than ``topk`` candidates).
        """
        ...
