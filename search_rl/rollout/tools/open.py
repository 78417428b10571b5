"""The ``open`` tool: the whole article of a search hit, by the hit's document id, so the model can read past a
passage. The retriever serves it (``POST /documents``, bounded in characters); search results show each passage's id
when ``open`` is on (``Doc 1(Title: T; id: 123) …``). Over a recording (``RecordingRetriever``) each answer
carries its recording key, as a search's does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from search_rl.datatypes import Passage
from search_rl.rollout.backends import RetrieverError
from search_rl.rollout.tools.base import ToolResult
from search_rl.tags import RETRIEVER_ERROR_TEXT

logger = logging.getLogger(__name__)


@runtime_checkable
class DocumentSource(Protocol):
    """A backend that serves whole documents by id (``RetrieverClient.documents``)."""

    async def documents(self, ids: Sequence[str], max_chars: int) -> list[Passage | None]: ...


@runtime_checkable
class KeyedDocumentSource(Protocol):
    """A document source whose answers have recording keys (``RecordingRetriever``); open calls point to them."""

    def document_keys(self, ids: Sequence[str], max_chars: int) -> list[str]: ...


class OpenTool:
    """``open(doc_id)``: the article a search result comes from, cut to ``max_chars`` characters.

    Args:
        source: the backend that serves documents (None only to check settings).
        max_chars: most characters of an article returned (the observation budget cuts further, in tokens).
        on_error: as ``rollout.on_retriever_error``: ``raise`` or ``observe`` a backend that failed for good.
    """

    name = "open"
    description = "Open a document found by search, by its id, and read the whole article."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"doc_id": {"type": "string", "description": "The id of a search result."}},
        "required": ["doc_id"],
    }

    def __init__(self, source: DocumentSource | None = None, max_chars: int = 4000, on_error: str = "raise") -> None:
        if max_chars < 1:
            raise ValueError(f"open: max_chars must be >= 1, got {max_chars}")
        self.source, self.max_chars, self.on_error = source, max_chars, on_error

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        return (await self.call_batch([arguments]))[0]

    async def call_batch(self, calls: Sequence[Mapping[str, Any]]) -> list[ToolResult]:
        """One request for the turn's documents.

        Raises:
            RetrieverError: the backend failed for good and ``on_error=raise``.
        """
        assert self.source is not None, "OpenTool was built without a document source"
        ids = [str(c["doc_id"]).strip() for c in calls]
        try:
            docs = await self.source.documents(ids, self.max_chars)
        except RetrieverError:
            if self.on_error == "raise":
                raise
            logger.warning("retriever failed to open %d documents; inserting error observations", len(ids))
            return [ToolResult(RETRIEVER_ERROR_TEXT, failed=True, unavailable=True) for _ in ids]
        keyed = self.source if isinstance(self.source, KeyedDocumentSource) else None
        keys = keyed.document_keys(ids, self.max_chars) if keyed is not None else [None] * len(ids)
        return [
            ToolResult(passages=(d,), retrieval_key=k)
            if d is not None
            else ToolResult(f"No document has the id {i!r}.", failed=True, retrieval_key=k)
            for i, d, k in zip(ids, docs, keys, strict=True)
        ]
