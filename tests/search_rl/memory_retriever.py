"""``InMemoryRetriever``: the rollout's ``Retriever`` protocol over passages held in memory, for the agent loop's unit
tests (no server). Passages are ranked by how many query words they contain (ties: corpus order); ``failing``
queries raise ``RetrieverError`` as an unreachable server would. The HTTP path is tested against real uvicorn
servers elsewhere (``tests/search_rl/rollout/backends/test_retriever_client.py``, ``test_search_calls.py``).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path

from retriever_server.settings import SHIPPED_CORPUS
from search_rl.datatypes import Passage
from search_rl.rollout.backends.retriever_client import RetrieverError, parse_document

_WORD = re.compile(r"\w+")


def shipped_passages(limit: int | None = None) -> list[Passage]:
    """Passages of the shipped corpus (``data/corpus/wiki_mini.jsonl.gz``), in file order."""
    out: list[Passage] = []
    with gzip.open(Path(SHIPPED_CORPUS), "rt", encoding="utf-8") as f:
        for line in f:
            out.append(parse_document(json.loads(line)))
            if limit is not None and len(out) >= limit:
                break
    return out


class InMemoryRetriever:
    """Top-k passages by query-word overlap; records every call in ``calls``."""

    def __init__(self, passages: Sequence[Passage], topk: int = 3, failing: Sequence[str] = ()) -> None:
        self.passages, self.topk, self.failing = list(passages), topk, set(failing)
        self._words = [set(_WORD.findall(f"{p.title} {p.text}".lower())) for p in self.passages]
        self.calls: list[list[str]] = []

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        self.calls.append(list(queries))
        for q in queries:
            if q in self.failing:
                raise RetrieverError(f"in-memory retriever: query {q!r} is set to fail", "memory://")
        return [self._top(q, topk or self.topk) for q in queries]

    def _top(self, query: str, k: int) -> list[Passage]:
        words = set(_WORD.findall(query.lower()))
        scores = [(len(words & w), -i) for i, w in enumerate(self._words)]
        best = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:k]
        return [self.passages[i] for i in best if scores[i][0] > 0]
