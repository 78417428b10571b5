"""Retrieval quality: recall@k of a retriever against known gold passages."""

from __future__ import annotations

from retriever_server.retrievers.base import Retriever


def recall_at_k(
    retriever: Retriever, queries: list[str], gold: list[int], ks: tuple[int, ...] = (1, 3), batch: int = 256
) -> dict[int, float]:
    """Fraction of queries whose gold corpus position is among the top-k, for each k in ``ks``.

    Args:
        retriever: any backend.
        queries: the questions.
        gold: the gold corpus position of each question.
        ks: cut-offs to report.
        batch: queries per ``search`` call.
    """
    if len(queries) != len(gold):
        raise ValueError(f"{len(queries)} queries but {len(gold)} gold positions")
    if not queries:
        raise ValueError("recall needs at least one query")
    kmax = max(ks)
    found = dict.fromkeys(ks, 0)
    for start in range(0, len(queries), batch):
        _, positions = retriever.search(queries[start : start + batch], kmax)
        for row, g in zip(positions.tolist(), gold[start : start + batch], strict=True):
            for k in ks:
                found[k] += g in row[:k]
    return {k: found[k] / len(queries) for k in ks}
