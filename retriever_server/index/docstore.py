"""A document store that lives in files, not on the heap: the corpus converted once into offsets + UTF-8 bytes that
every worker process memory-maps, so N workers share one copy through the page cache.

A store is a folder::

    STORE.json         rows, the source file's sha256 (the corpus hash indexes are keyed on), its size and mtime
    contents.bin       every passage's ``contents``, UTF-8, back to back
    contents.idx.npy   int64 (rows + 1) byte offsets into contents.bin
    ids.bin            every passage's ``id``, UTF-8, back to back
    ids.idx.npy        int64 (rows + 1) byte offsets into ids.bin

Looking up row ``i`` slices the two mapped files; nothing is parsed at start-up, so opening a store of wiki-18's
21M passages takes milliseconds and costs no memory beyond the pages a search touches. Conversion streams the jsonl
(progress every ``PROGRESS_ROWS`` rows), hashes the source bytes on the way, and checks ids for duplicates with
64-bit hashes sorted at the end, so it holds no Python string per passage.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import mmap
import os
import shutil
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol, cast

import numpy as np
import orjson

logger = logging.getLogger(__name__)

STORE_FORMAT_VERSION = 1
META_FILE = "STORE.json"
PROGRESS_ROWS = 100_000
"""Rows between progress reports while converting."""

ProgressFn = Callable[[str, int, int], None]


class _Column:
    """One string column: a mapped bytes file plus its (rows + 1) offsets."""

    def __init__(self, folder: Path, name: str) -> None:
        self.offsets: np.ndarray = np.load(folder / f"{name}.idx.npy", mmap_mode="r")
        data = folder / f"{name}.bin"
        self._file = open(data, "rb")  # noqa: SIM115 (lives as long as the store)
        # mmap cannot map an empty file; a column of empty strings has no bytes to map
        self._buf: mmap.mmap | bytes = (
            mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if data.stat().st_size else b""
        )

    def get(self, i: int) -> str:
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        return self._buf[start:stop].decode("utf-8")


class DocStore:
    """Rows of (id, contents) by position, read from a store folder through mmap.

    Raises:
        FileNotFoundError: the folder holds no ``STORE.json``.
        ValueError: the store's format or file sizes disagree with its ``STORE.json``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        meta_path = self.folder / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"{self.folder} is not a document store (no {META_FILE}); convert a jsonl first")
        self.meta: dict[str, object] = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format_version") != STORE_FORMAT_VERSION:
            raise ValueError(
                f"{self.folder}: store format {self.meta.get('format_version')}, this code reads {STORE_FORMAT_VERSION}"
                " (delete the folder to convert again)"
            )
        self._ids = _Column(self.folder, "ids")
        self._contents = _Column(self.folder, "contents")
        rows = int(self.meta["rows"])  # type: ignore[call-overload]
        for col in (self._ids, self._contents):
            if len(col.offsets) != rows + 1:
                raise ValueError(f"{self.folder}: offsets hold {len(col.offsets) - 1} rows, {META_FILE} says {rows}")
        self.rows = rows

    @property
    def sha256(self) -> str:
        """sha256 of the source file's bytes (the corpus hash indexes are keyed on)."""
        return str(self.meta["sha256"])

    def __len__(self) -> int:
        return self.rows

    def doc_id(self, i: int) -> str:
        """The id of row ``i``."""
        return self._ids.get(i)

    def contents(self, i: int) -> str:
        """The contents of row ``i``."""
        return self._contents.get(i)


def _write_offsets(path: Path, ends: array) -> None:  # type: ignore[type-arg]
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = np.frombuffer(ends, dtype=np.int64) if len(ends) else offsets[1:]
    np.save(path, offsets)


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def _iter_lines(f: _Readable) -> Iterator[bytes]:
    """The file's lines, read in 4 MiB chunks."""
    tail = b""
    while chunk := f.read(1 << 22):
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        yield from lines
    if tail:
        yield tail


def _check_unique(id_hashes: array, lines: array, store: DocStore, source: Path) -> None:  # type: ignore[type-arg]
    """Raise for the first duplicate id (by the line of its second occurrence); equal hashes are compared as text."""
    h = np.frombuffer(id_hashes, dtype=np.int64)
    order = np.argsort(h, kind="stable")
    same = np.flatnonzero(h[order][1:] == h[order][:-1])
    line_of = np.frombuffer(lines, dtype=np.int64)
    first_dup: tuple[int, str] | None = None
    for k in same:
        a, b = int(order[k]), int(order[k + 1])
        if store.doc_id(a) == store.doc_id(b):
            later = max(a, b)
            if first_dup is None or line_of[later] < first_dup[0]:
                first_dup = (int(line_of[later]), store.doc_id(later))
    if first_dup is not None:
        raise ValueError(f"{source}:{first_dup[0]}: duplicate id {first_dup[1]!r}")


def convert_jsonl(source: Path, dest: Path, progress: ProgressFn | None = None) -> DocStore:
    """Convert a jsonl(.gz) corpus of ``{"id", "contents"}`` rows into a store at ``dest`` (written beside it, then
    renamed, so a crash never leaves a store that looks complete). A row without ``id`` gets its row number.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: a line is not JSON, lacks ``contents`` (str), or repeats an id; the message names file and line.
    """
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"corpus file not found: {source} (set RETRIEVER_CORPUS_PATH)")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        rows = _write_store(source, tmp, progress)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    logger.info("converted %s into a document store of %d rows at %s", source, rows, dest)
    return DocStore(dest)


def _write_store(source: Path, tmp: Path, progress: ProgressFn | None) -> int:
    """Stream ``source`` into the store files in ``tmp``; return the row count."""
    sha = hashlib.sha256()
    id_ends, content_ends, id_hashes, lines = array("q"), array("q"), array("q"), array("q")
    id_pos = content_pos = 0
    total = source.stat().st_size
    with open(source, "rb") as raw, open(tmp / "ids.bin", "wb") as ids_f, open(tmp / "contents.bin", "wb") as c_f:
        hashing = _HashingReader(raw, sha)
        # the corpus hash is of the file's bytes (compressed for .gz); rows are parsed from the decompressed text
        gz = source.suffix == ".gz"
        text: _Readable = gzip.GzipFile(fileobj=cast("IO[bytes]", hashing), mode="rb") if gz else hashing
        for lineno, line in enumerate(_iter_lines(text), start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"{source}:{lineno}: not valid JSON ({e})") from e
            contents = row.get("contents") if isinstance(row, dict) else None
            if not isinstance(contents, str):
                raise ValueError(f"{source}:{lineno}: row needs a string field 'contents'")
            doc_id = str(row.get("id", len(id_ends)))
            id_bytes, c_bytes = doc_id.encode("utf-8"), contents.encode("utf-8")
            ids_f.write(id_bytes)
            c_f.write(c_bytes)
            id_pos += len(id_bytes)
            content_pos += len(c_bytes)
            id_ends.append(id_pos)
            content_ends.append(content_pos)
            id_hashes.append(hash(doc_id))
            lines.append(lineno)
            if progress is not None and len(id_ends) % PROGRESS_ROWS == 0:
                progress("converting corpus", hashing.bytes_read, total)
        hashing.drain()
    if not id_ends:
        raise ValueError(f"{source}: corpus has no documents")
    _write_offsets(tmp / "ids.idx.npy", id_ends)
    _write_offsets(tmp / "contents.idx.npy", content_ends)
    st = source.stat()
    meta = {
        "format_version": STORE_FORMAT_VERSION,
        "rows": len(id_ends),
        "sha256": sha.hexdigest(),
        "source": {"path": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
    }
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    _check_unique(id_hashes, lines, DocStore(tmp), source)
    if progress is not None:
        progress("converting corpus", total, total)
    return len(id_ends)


class _HashingReader:
    """A read-only file wrapper that feeds every byte read into a hash (for gzip sources)."""

    def __init__(self, raw: IO[bytes], sha: hashlib._Hash) -> None:
        self.raw, self.sha, self.bytes_read = raw, sha, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.bytes_read += len(data)
        return data

    def drain(self) -> None:
        """Hash what the gzip reader left unread (trailing bytes), so the hash covers the whole file."""
        while data := self.read(1 << 20):
            del data


def slice_store(store: DocStore, start: int, stop: int, dest: Path) -> DocStore:
    """Write rows ``start:stop`` of ``store`` as a store of their own at ``dest`` (a shard's documents); its hash is
    derived from the parent's hash and the range."""
    if not 0 <= start < stop <= len(store):
        raise ValueError(f"rows {start}:{stop} are not a range of a store of {len(store)} rows")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, col in (("ids", store._ids), ("contents", store._contents)):
        lo, hi = int(col.offsets[start]), int(col.offsets[stop])
        with open(tmp / f"{name}.bin", "wb") as f:
            for at in range(lo, hi, 1 << 26):  # 64 MiB at a time
                f.write(col._buf[at : min(at + (1 << 26), hi)])
        np.save(tmp / f"{name}.idx.npy", np.asarray(col.offsets[start : stop + 1], dtype=np.int64) - lo)
    meta = {
        "format_version": STORE_FORMAT_VERSION,
        "rows": stop - start,
        "sha256": hashlib.sha256(f"{store.sha256}:{start}:{stop}".encode()).hexdigest(),
        "source": {"slice_of": str(store.folder.resolve()), "start": start, "stop": stop},
    }
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return DocStore(dest)
