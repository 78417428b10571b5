"""The ``search`` tool: the search backends (``rollout/backends``) behind the tool seam.

A turn's searches are answered together (``call_batch``): one batched backend call, as the loop made before the
seam, so a recording, a cost meter and a simulated backend see exactly the same requests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from search_rl.datatypes import Passage
from search_rl.rollout.backends import RetrieverError
from search_rl.rollout.tools.base import ToolResult
from search_rl.tags import EMPTY_QUERY_FEEDBACK, LONG_QUERY_FEEDBACK, RETRIEVER_ERROR_TEXT

logger = logging.getLogger(__name__)


class Retriever(Protocol):
    """What the loop needs from a search backend (``RetrieverClient`` is the HTTP one)."""

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]: ...


@runtime_checkable
class KeyedRetriever(Protocol):
    """A retriever whose answers have recording keys (``RecordingRetriever``); search calls point to them."""

    def retrieval_keys(self, queries: Sequence[str], topk: int | None = None) -> list[str]: ...


class SearchTool:
    """``search(query)``: the top passages of the search backend for a query.

    Args:
        retriever: the search backend.
        on_error: after the backend's own retries, ``raise`` the ``RetrieverError`` (the step fails) or ``observe``
            (each call of the batch answers ``RETRIEVER_ERROR_TEXT``, failed).
        max_query_chars: longest query; a longer or empty one is answered with the tags' feedback text, failed
            (the tags format refuses those before the tool, as invalid actions).
    """

    name = "search"
    description = "Search an encyclopedia. Returns the top passages for the query, each with its title."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "A short search query."}},
        "required": ["query"],
    }

    def __init__(self, retriever: Retriever, on_error: str = "raise", max_query_chars: int = 512) -> None:
        self.retriever, self.on_error, self.max_query_chars = retriever, on_error, max_query_chars

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        return (await self.call_batch([arguments]))[0]

    async def call_batch(self, calls: Sequence[Mapping[str, Any]]) -> list[ToolResult]:
        """One backend request for every well-formed query of ``calls``; results in call order.

        Raises:
            RetrieverError: the backend failed for good and ``on_error=raise``.
        """
        queries = [" ".join(str(c["query"]).split()) for c in calls]
        out: list[ToolResult | None] = [self._refusal(q) for q in queries]
        sent = [q for q, r in zip(queries, out, strict=True) if r is None]
        if not sent:
            return [r for r in out if r is not None]
        try:
            results: list[list[Passage]] | None = await self.retriever.search(sent)
        except RetrieverError:
            if self.on_error == "raise":
                raise
            logger.warning("retriever failed for %d queries; inserting error observations", len(sent))
            results = None
        keyed = self.retriever if isinstance(self.retriever, KeyedRetriever) else None
        keys = keyed.retrieval_keys(sent) if keyed is not None and results is not None else [None] * len(sent)
        answers = iter(
            [ToolResult(RETRIEVER_ERROR_TEXT, failed=True, unavailable=True) for _ in sent]
            if results is None
            else [ToolResult(passages=tuple(r), retrieval_key=k) for r, k in zip(results, keys, strict=True)]
        )
        return [r if r is not None else next(answers) for r in out]

    def _refusal(self, query: str) -> ToolResult | None:
        if not query:
            return ToolResult(EMPTY_QUERY_FEEDBACK.strip(), failed=True)
        if len(query) > self.max_query_chars:
            return ToolResult(LONG_QUERY_FEEDBACK.strip(), failed=True)
        return None
