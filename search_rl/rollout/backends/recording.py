"""``RecordingRetriever``: any search backend, with each retrieval and opened document written to a recording
(``recording_store``) or answered from it.

Modes: ``record`` writes through, ``replay`` answers only from the file (a miss is a ``RecordingMiss`` naming the
query or document id, or goes to the live backend with ``on_miss=live``), ``cache`` answers hits and records misses.
A query or document id asked twice in one batch is fetched once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from search_rl.datatypes import Passage
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.meter import CostMeter
from search_rl.rollout.backends.recording_store import DocumentEntry, Entry, RecordingStore, document_key, retrieval_key
from search_rl.rollout.backends.retriever_client import RetrieverError


class RecordingMiss(RetrieverError):
    """``replay``: a query or document the recording does not hold (a ``RetrieverError``, so ``on_retriever_error``
    applies)."""


class Backend(Protocol):
    """What ``RecordingRetriever`` wraps: a retriever that says which search engine it is (and, the retriever
    service, serves whole documents: ``async documents(ids, max_chars) -> list[Passage | None]``)."""

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]: ...

    def fingerprint(self) -> BackendIdentity: ...


class RecordingRetriever:
    """Any backend, with each retrieval and opened document written to a ``RecordingStore`` or answered from it (the
    ``Retriever`` protocol of the agent loop, and the ``open`` tool's ``DocumentSource``).

    Args:
        store: the recording file.
        mode: ``record``, ``replay`` or ``cache`` (module docstring).
        fingerprint: the backend this recording answers as.
        default_topk: the top-k of ``search(queries)`` without one (``retriever.topk``).
        inner: the live backend; None = replay only (``retriever.backend=replay``).
        on_miss: ``replay``: ``error`` or ``live``.

    Attributes:
        hits, misses: retrievals answered from the file / sent to the live backend.
        document_hits, document_misses: the same for opened documents (apart: the cost meter counts searches).
    """

    def __init__(
        self,
        store: RecordingStore,
        mode: str,
        fingerprint: BackendIdentity,
        default_topk: int,
        inner: Backend | None = None,
        on_miss: str = "error",
    ) -> None:
        if mode not in ("record", "replay", "cache"):
            raise ValueError(f"retriever.recording.mode must be record, replay or cache here, got {mode!r}")
        if inner is None and (mode != "replay" or on_miss == "live"):
            raise ValueError(f"retriever.recording.mode={mode} (on_miss={on_miss}) needs a live backend")
        self.store, self.mode, self.fp, self.default_topk = store, mode, fingerprint, default_topk
        self.inner, self.on_miss = inner, on_miss
        self.hits = self.misses = self.document_hits = self.document_misses = 0
        self._inner_meter = getattr(inner, "meter", None)
        if not store.read_only:
            store.add_fingerprint(fingerprint)

    def fingerprint(self) -> BackendIdentity:
        return self.fp

    @property
    def meter(self) -> CostMeter:
        """The live backend's calls and cost, with the answers served from the file as ``replayed``."""
        inner = self._inner_meter
        return CostMeter(inner.calls, inner.cost_usd, self.hits) if inner is not None else CostMeter(replayed=self.hits)

    def check_reachable(self) -> None:
        """The live backend's check when it may be asked; else (replay, misses are errors) the file must hold answers
        of this fingerprint.

        Raises:
            RecordingMiss: a replay-only recording without an entry of the fingerprint.
        """
        if self.inner is not None and (self.mode != "replay" or self.on_miss == "live"):
            check = getattr(self.inner, "check_reachable", None)
            if check is not None:
                check()
        elif not any(fid == self.fp.id and n for fid, _, n in self.store.fingerprints()):
            raise RecordingMiss(f"the recording {self.store.path} holds no retrieval of fingerprint {self.fp.id}")

    @property
    def serves_documents(self) -> bool:
        """Whether ``documents`` can answer (the ``open`` tool): the live backend serves documents, or, replay-only,
        the recording is of the retriever service (web and simulated backends serve none)."""
        if self.inner is not None:
            return callable(getattr(self.inner, "documents", None))
        return self.fp.backend == "http"

    def retrieval_keys(self, queries: Sequence[str], topk: int | None = None) -> list[str]:
        """The recording keys of ``queries`` (what a rollout record points to)."""
        k = topk or self.default_topk
        return [retrieval_key(q, k, self.fp.id) for q in queries]

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """Top-``topk`` passages per query, from the file, the live backend, or both (by mode).

        Raises:
            RecordingMiss: ``replay`` and a query not in the file (``on_miss=error``).
            RetrieverError / SearchBudgetExhausted: from the live backend.
        """
        k = topk or self.default_topk
        keys = self.retrieval_keys(queries, k)
        found = {} if self.mode == "record" else self.store.get_many(keys)
        hits, unique = self._to_fetch(keys, found, "queries", f"top-k {k}", lambda i: repr(queries[i]))
        self.hits += hits
        self.misses += len(unique)
        live = await self._search_live([queries[i] for i in unique], [keys[i] for i in unique], k)
        out: list[list[Passage]] = []
        for key in keys:
            out.append(list(found[key].passages) if key in found else live[key])
        return out

    def document_keys(self, ids: Sequence[str], max_chars: int) -> list[str]:
        """The recording keys of opened documents (what a rollout record points to)."""
        return [document_key(i, max_chars, self.fp.id) for i in ids]

    async def documents(self, ids: Sequence[str], max_chars: int) -> list[Passage | None]:
        """The article of each id, cut to ``max_chars`` (None: no such document), from the file, the live backend,
        or both, by mode as ``search``.

        Raises:
            TypeError: the recorded backend serves no documents (web, simulated).
            RecordingMiss: ``replay`` and an id not in the file (``on_miss=error``).
            RetrieverError: from the live backend.
        """
        if not self.serves_documents:
            raise TypeError(
                f"the search backend {self.fp.backend} (fingerprint {self.fp.id}) serves no documents; the open tool "
                "needs retriever.backend=http, or a replay of a recording of it"
            )
        keys = self.document_keys(ids, max_chars)
        found = {} if self.mode == "record" else self.store.get_documents(keys)
        hits, unique = self._to_fetch(keys, found, "documents", f"max_chars {max_chars}", lambda i: f"id {ids[i]!r}")
        self.document_hits += hits
        self.document_misses += len(unique)
        live = await self._documents_live([ids[i] for i in unique], [keys[i] for i in unique], max_chars)
        return [found[key].passage if key in found else live[key] for key in keys]

    def _to_fetch(
        self, keys: list[str], found: Mapping[str, object], what: str, setting: str, shown: Callable[[int], str]
    ) -> tuple[int, list[int]]:
        """How many of ``keys`` the file answered, and the rows to ask the live backend: the first row of each
        distinct missing key (a query or id asked twice costs one call). ``shown(row)`` names a row in the error.

        Raises:
            RecordingMiss: ``replay`` with ``on_miss=error`` and a key not in the file.
        """
        missing = [i for i, key in enumerate(keys) if key not in found]
        if missing and self.mode == "replay" and self.on_miss == "error":
            raise RecordingMiss(
                f"{len(missing)} of {len(keys)} {what} are not in the recording {self.store.path} (fingerprint "
                f"{self.fp.id}, {setting}), first: {shown(missing[0])}. Record them with retriever.recording.mode="
                "record or cache, or set retriever.recording.on_miss=live"
            )
        return len(keys) - len(missing), list({keys[i]: i for i in reversed(missing)}.values())[::-1]

    async def _documents_live(self, ids: list[str], keys: list[str], max_chars: int) -> dict[str, Passage | None]:
        if not ids:
            return {}
        source: Any = self.inner  # serves_documents checked that it has documents()
        docs: list[Passage | None] = await source.documents(ids, max_chars)
        if self.mode in ("record", "cache"):
            now = time.time()
            entries = [
                DocumentEntry(k, self.fp.id, i, max_chars, d, now) for k, i, d in zip(keys, ids, docs, strict=True)
            ]
            self.store.put_documents(entries, replace=self.mode == "record")
        return dict(zip(keys, docs, strict=True))

    async def _search_live(self, queries: list[str], keys: list[str], k: int) -> dict[str, list[Passage]]:
        if not queries:
            return {}
        assert self.inner is not None  # checked in __init__ for every mode that reaches here
        write = self.mode in ("record", "cache")
        try:
            results = await self.inner.search(queries, k)
        except PartialResults as e:  # a budget ran out mid-batch: keep what was paid for, then stop
            if write:
                self._write({keys[i]: (queries[i], p) for i, p in e.done.items()}, k)
            raise
        answered = dict(zip(keys, zip(queries, results, strict=True), strict=True))
        if write:
            self._write(answered, k)
        return {key: passages for key, (_, passages) in answered.items()}

    def _write(self, answered: dict[str, tuple[str, list[Passage]]], k: int) -> None:
        now = time.time()
        entries = [Entry(key, self.fp.id, q, k, tuple(p), now) for key, (q, p) in answered.items()]
        self.store.put_many(entries, replace=self.mode == "record")


class PartialResults(Exception):
    """An error raised mid-batch; ``done`` maps query positions to the passages already obtained (and paid for)."""

    def __init__(self, message: str, done: dict[int, list[Passage]] | None = None) -> None:
        super().__init__(message)
        self.done = dict(done or {})
