"""Retrieval recordings: a content-addressed SQLite store of what a search backend returned, and the
``RecordingRetriever`` that writes to it or answers from it around any backend.

Key of one retrieval = sha256 of (normalised query, top-k, backend fingerprint id); value = the passages as the
backend returned them. The fingerprint (``BackendIdentity``) says which search engine answered: the corpus and index of
an HTTP retriever (its ``/health``), the web provider and the day, the simulating model and prompt. The store is
one file a user can copy: WAL journal and a busy timeout, so several processes (Ray workers, generators) write to it
at once. Modes: ``record`` writes through, ``replay`` answers only from the file (a miss is a ``RecordingMiss``
naming the query, or goes to the live backend with ``on_miss=live``), ``cache`` answers hits and records misses.
A query asked twice in one batch is searched once.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from search_rl.datatypes import Passage
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.meter import CostMeter
from search_rl.rollout.backends.retriever_client import RetrieverError

SCHEMA = """
CREATE TABLE IF NOT EXISTS fingerprints (id TEXT PRIMARY KEY, backend TEXT NOT NULL, description TEXT NOT NULL,
                                         created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS retrievals (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, query TEXT NOT NULL,
                                       topk INTEGER NOT NULL, passages TEXT NOT NULL, created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS retrievals_by_fingerprint ON retrievals (fingerprint);
"""
BUSY_TIMEOUT_MS = 60_000


class RecordingMiss(RetrieverError):
    """``replay``: a query the recording does not hold (a ``RetrieverError``, so ``on_retriever_error`` applies)."""


def normalise_query(query: str) -> str:
    """NFC, surrounding whitespace stripped, inner runs of whitespace made one space. Case is kept: a case-sensitive
    backend may answer ``Paris`` and ``paris`` differently, and a replay must give what the live backend gave.

    >>> normalise_query("  who  wrote\\tHamlet? ")
    'who wrote Hamlet?'
    """
    return " ".join(unicodedata.normalize("NFC", query).split())


def retrieval_key(query: str, topk: int, fingerprint_id: str) -> str:
    """The content address of one retrieval: 24 hex digits of sha256 over (normalised query, top-k, fingerprint).

    >>> retrieval_key("a  b", 3, "f") == retrieval_key(" a b", 3, "f") != retrieval_key("a b", 5, "f")
    True
    """
    payload = json.dumps([normalise_query(query), int(topk), fingerprint_id], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Entry:
    """One stored retrieval."""

    key: str
    fingerprint: str
    query: str
    topk: int
    passages: tuple[Passage, ...]
    created_at: float


def _passages_json(passages: Sequence[Passage]) -> str:
    return json.dumps([asdict(p) for p in passages], ensure_ascii=False)


def _entry(row: sqlite3.Row | tuple[Any, ...]) -> Entry:
    key, fp, query, topk, passages, created = row
    return Entry(key, fp, query, int(topk), tuple(Passage(**p) for p in json.loads(passages)), float(created))


def sqlite_uri(path: str | Path, mode: str) -> str:
    """The SQLite ``file:`` URI of ``path`` opened in ``mode`` (``ro``, ``rw``, ``rwc``), the path percent-escaped: a
    bare ``#``, ``?`` or ``%`` in a file name would end the path there (``run#2.sqlite`` would open ``run``) and drop
    ``mode``.

    >>> sqlite_uri("/tmp/run #2?.sqlite", "ro")
    'file:///tmp/run%20%232%3F.sqlite?mode=ro'
    """
    return f"{Path(path).absolute().as_uri()}?mode={mode}"


class RecordingStore:
    """The SQLite file of a recording. One connection per process and thread (sqlite3 connections are neither
    fork- nor thread-safe); every write is its own committed transaction, so nothing is lost when a run stops."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.is_file():
            raise FileNotFoundError(f"no recording at {self.path}")
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            if not self.read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            uri = sqlite_uri(self.path, "ro" if self.read_only else "rwc")
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if not self.read_only:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(SCHEMA)
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        """Close this thread's connection (a later call reopens it)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def add_fingerprint(self, fp: BackendIdentity) -> None:
        """Register a backend fingerprint (idempotent)."""
        self._conn().execute(
            "INSERT OR IGNORE INTO fingerprints VALUES (?, ?, ?, ?)", (fp.id, fp.backend, fp.describe(), time.time())
        )

    def fingerprints(self) -> list[tuple[str, str, int]]:
        """``(id, description JSON, entries)`` of every recorded backend, oldest first."""
        rows = self._conn().execute(
            "SELECT f.id, f.description, (SELECT COUNT(*) FROM retrievals r WHERE r.fingerprint = f.id) "
            "FROM fingerprints f ORDER BY f.created_at"
        )
        return [(str(i), str(d), int(n)) for i, d, n in rows]

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The stored entries among ``keys``."""
        out: dict[str, Entry] = {}
        conn = self._conn()
        for start in range(0, len(keys), 500):  # SQLite's host-parameter limit
            part = list(keys[start : start + 500])
            marks = ",".join("?" * len(part))
            for row in conn.execute(f"SELECT * FROM retrievals WHERE key IN ({marks})", part):
                entry = _entry(row)
                out[entry.key] = entry
        return out

    def put_many(self, entries: Sequence[Entry], *, replace: bool) -> int:
        """Write entries in one transaction; ``replace=False`` keeps existing keys. Returns the rows written."""
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        rows = [(e.key, e.fingerprint, e.query, e.topk, _passages_json(e.passages), e.created_at) for e in entries]
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            before = conn.total_changes
            conn.executemany(f"{verb} INTO retrievals VALUES (?, ?, ?, ?, ?, ?)", rows)
            written = conn.total_changes - before
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return written

    def entries(self, fingerprint: str | None = None, contains: str | None = None, limit: int = 50) -> Iterator[Entry]:
        """Stored entries, newest first, optionally of one fingerprint and with ``contains`` in the query."""
        sql, args = "SELECT * FROM retrievals WHERE 1=1", list[str | int]()
        if fingerprint:
            sql, args = sql + " AND fingerprint = ?", [*args, fingerprint]
        if contains:
            sql, args = sql + " AND instr(lower(query), lower(?)) > 0", [*args, contains]
        args.append(limit)
        for row in self._conn().execute(sql + " ORDER BY created_at DESC LIMIT ?", args):
            yield _entry(row)

    def merge_from(self, other: str | Path) -> int:
        """Copy the fingerprints and entries of another recording that this one lacks; returns the entries added."""
        conn = self._conn()
        conn.execute("ATTACH DATABASE ? AS other", (sqlite_uri(other, "ro"),))
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR IGNORE INTO fingerprints SELECT * FROM other.fingerprints")
            before = conn.total_changes
            conn.execute("INSERT OR IGNORE INTO retrievals SELECT * FROM other.retrievals")
            added = conn.total_changes - before
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.execute("DETACH DATABASE other")
        return added


class Backend(Protocol):
    """What ``RecordingRetriever`` wraps: a retriever that says which search engine it is."""

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]: ...

    def fingerprint(self) -> BackendIdentity: ...


class RecordingRetriever:
    """Any backend, with each retrieval written to a ``RecordingStore`` or answered from it (the ``Retriever``
    protocol of the agent loop).

    Args:
        store: the recording file.
        mode: ``record``, ``replay`` or ``cache`` (module docstring).
        fingerprint: the backend this recording answers as.
        default_topk: the top-k of ``search(queries)`` without one (``retriever.topk``).
        inner: the live backend; None = replay only (``retriever.backend=replay``).
        on_miss: ``replay``: ``error`` or ``live``.

    Attributes:
        hits, misses: retrievals answered from the file / sent to the live backend.
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
        self.hits = self.misses = 0
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
        missing = [i for i, key in enumerate(keys) if key not in found]
        if missing and self.mode == "replay" and self.on_miss == "error":
            q = queries[missing[0]]
            raise RecordingMiss(
                f"{len(missing)} of {len(queries)} queries are not in the recording {self.store.path} "
                f"(fingerprint {self.fp.id}, top-k {k}), first: {q!r}. Record them with retriever.recording.mode="
                "record or cache, or set retriever.recording.on_miss=live"
            )
        self.hits += len(queries) - len(missing)
        unique = list({keys[i]: i for i in reversed(missing)}.values())[::-1]  # a query asked twice costs one call
        self.misses += len(unique)
        live = await self._search_live([queries[i] for i in unique], [keys[i] for i in unique], k)
        out: list[list[Passage]] = []
        for key in keys:
            out.append(list(found[key].passages) if key in found else live[key])
        return out

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
