"""The file of a retrieval recording: a content-addressed SQLite store of what a search backend returned (searches,
and the documents the ``open`` tool read); ``RecordingRetriever`` (``recording``) writes it and answers from it.

Key of one retrieval = sha256 of (normalised query, top-k, backend fingerprint id); value = the passages as the
backend returned them. Key of one opened document = sha256 of (document id, max characters, fingerprint id); value =
the article, or null for an id the backend did not know (that answer replays too). The fingerprint
(``BackendIdentity``) says which search engine answered. The store is one file a user can copy: WAL journal and a busy
timeout, so several processes (Ray workers, generators) write to it at once. Files written before the documents table
existed still work: a read-only open finds no document in them, a writable one adds the table.
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
from typing import Any

from search_rl.datatypes import Passage
from search_rl.rollout.backends.identity import BackendIdentity

SCHEMA = """
CREATE TABLE IF NOT EXISTS fingerprints (id TEXT PRIMARY KEY, backend TEXT NOT NULL, description TEXT NOT NULL,
                                         created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS retrievals (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, query TEXT NOT NULL,
                                       topk INTEGER NOT NULL, passages TEXT NOT NULL, created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS retrievals_by_fingerprint ON retrievals (fingerprint);
CREATE TABLE IF NOT EXISTS documents (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, doc_id TEXT NOT NULL,
                                      max_chars INTEGER NOT NULL, passage TEXT NOT NULL, created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS documents_by_fingerprint ON documents (fingerprint);
"""
BUSY_TIMEOUT_MS = 60_000


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


def document_key(doc_id: str, max_chars: int, fingerprint_id: str) -> str:
    """The content address of one opened document: 24 hex digits of sha256 over (id, max characters, fingerprint).

    >>> document_key("12", 4000, "f") != document_key("12", 500, "f") != document_key("13", 500, "f")
    True
    """
    payload = json.dumps(["document", doc_id, int(max_chars), fingerprint_id], ensure_ascii=False)
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


@dataclass(frozen=True)
class DocumentEntry:
    """One stored document (``open``); ``passage`` None = the backend knew no document of that id."""

    key: str
    fingerprint: str
    doc_id: str
    max_chars: int
    passage: Passage | None
    created_at: float

    @property
    def passages(self) -> tuple[Passage, ...]:
        """The document as ``Entry.passages`` (empty for an unknown id), for code that shows either kind."""
        return (self.passage,) if self.passage is not None else ()


def _passages_json(passages: Sequence[Passage]) -> str:
    return json.dumps([asdict(p) for p in passages], ensure_ascii=False)


def _entry(row: sqlite3.Row | tuple[Any, ...]) -> Entry:
    key, fp, query, topk, passages, created = row
    return Entry(key, fp, query, int(topk), tuple(Passage(**p) for p in json.loads(passages)), float(created))


def _document(row: sqlite3.Row | tuple[Any, ...]) -> DocumentEntry:
    key, fp, doc_id, max_chars, passage, created = row
    stored = json.loads(passage)
    return DocumentEntry(key, fp, doc_id, int(max_chars), Passage(**stored) if stored else None, float(created))


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

    def has_documents(self, schema: str = "main") -> bool:
        """Whether the file has the documents table (a read-only open of a file older than it has none)."""
        sql = f"SELECT 1 FROM {schema}.sqlite_master WHERE type = 'table' AND name = 'documents'"
        return self._conn().execute(sql).fetchone() is not None

    def fingerprints(self) -> list[tuple[str, str, int]]:
        """``(id, description JSON, entries)`` of every recorded backend, oldest first; entries count retrievals and
        opened documents."""
        count = "(SELECT COUNT(*) FROM {} t WHERE t.fingerprint = f.id)"
        tables = ["retrievals", "documents"] if self.has_documents() else ["retrievals"]
        entries = " + ".join(count.format(t) for t in tables)
        rows = self._conn().execute(f"SELECT f.id, f.description, {entries} FROM fingerprints f ORDER BY f.created_at")
        return [(str(i), str(d), int(n)) for i, d, n in rows]

    def _select(self, table: str, keys: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        conn = self._conn()
        for start in range(0, len(keys), 500):  # SQLite's host-parameter limit
            part = list(keys[start : start + 500])
            marks = ",".join("?" * len(part))
            yield from conn.execute(f"SELECT * FROM {table} WHERE key IN ({marks})", part)

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The stored retrievals among ``keys``."""
        return {entry.key: entry for entry in map(_entry, self._select("retrievals", keys))}

    def get_documents(self, keys: Sequence[str]) -> dict[str, DocumentEntry]:
        """The stored documents among ``keys`` (none in a read-only file without the documents table)."""
        if not self.has_documents():
            return {}
        return {entry.key: entry for entry in map(_document, self._select("documents", keys))}

    def _insert(self, table: str, rows: Sequence[tuple[Any, ...]], replace: bool) -> int:
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            before = conn.total_changes
            conn.executemany(f"{verb} INTO {table} VALUES (?, ?, ?, ?, ?, ?)", rows)
            written = conn.total_changes - before
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return written

    def put_many(self, entries: Sequence[Entry], *, replace: bool) -> int:
        """Write retrievals in one transaction; ``replace=False`` keeps existing keys. Returns the rows written."""
        rows = [(e.key, e.fingerprint, e.query, e.topk, _passages_json(e.passages), e.created_at) for e in entries]
        return self._insert("retrievals", rows, replace)

    def put_documents(self, entries: Sequence[DocumentEntry], *, replace: bool) -> int:
        """Write documents as ``put_many`` writes retrievals. Returns the rows written."""
        rows = [
            (e.key, e.fingerprint, e.doc_id, e.max_chars, json.dumps(e.passage and asdict(e.passage)), e.created_at)
            for e in entries
        ]
        return self._insert("documents", rows, replace)

    def keys_starting(self, prefix: str, limit: int = 2) -> list[str]:
        """Up to ``limit`` keys of retrievals and documents that start with ``prefix``."""
        tables = ["retrievals", "documents"] if self.has_documents() else ["retrievals"]
        union = " UNION ALL ".join(f"SELECT key FROM {t} WHERE substr(key, 1, ?) = ?" for t in tables)
        args = [a for _ in tables for a in (len(prefix), prefix)]
        return [str(k) for (k,) in self._conn().execute(f"{union} LIMIT ?", [*args, limit])]

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
        """Copy the fingerprints, retrievals and documents of another recording that this one lacks; returns the
        retrievals and documents added."""
        conn = self._conn()
        conn.execute("ATTACH DATABASE ? AS other", (sqlite_uri(other, "ro"),))
        try:
            tables = ["retrievals", "documents"] if self.has_documents("other") else ["retrievals"]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR IGNORE INTO fingerprints SELECT * FROM other.fingerprints")
            before = conn.total_changes
            for table in tables:
                conn.execute(f"INSERT OR IGNORE INTO {table} SELECT * FROM other.{table}")
            added = conn.total_changes - before
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.execute("DETACH DATABASE other")
        return added
