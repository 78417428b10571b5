"""The document collection a retriever serves, by position, read from a memory-mapped document store.

A jsonl(.gz) corpus of ``{"id", "contents"}`` rows is converted into a store on first use (streamed, with
progress) and the store is reused while the file is unchanged, so no passage lives on the Python heap and every
worker process shares the store's pages. ``RETRIEVER_CORPUS_PATH`` may also name a store folder directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from filelock import FileLock

from retriever_server.index.docstore import META_FILE, DocStore, ProgressFn, convert_jsonl


class StoredStrings(Sequence[str]):
    """A read-only list view of one column of a store (ids or contents); slices return lists."""

    def __init__(self, get: Callable[[int], str], n: int) -> None:
        self._get, self._n = get, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"row {i} is outside a corpus of {self._n} rows")
        return self._get(i)

    def __iter__(self) -> Iterator[str]:
        return (self._get(j) for j in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != self._n:
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Corpus:
    """Documents in file order; retrievers return positions into them."""

    store: DocStore
    path: Path
    """The file (or store folder) the corpus was opened from."""

    @property
    def sha256(self) -> str:
        """Hash of the corpus file's bytes: part of the index cache key."""
        return self.store.sha256

    @property
    def ids(self) -> StoredStrings:
        return StoredStrings(self.store.doc_id, len(self.store))

    @property
    def contents(self) -> StoredStrings:
        return StoredStrings(self.store.contents, len(self.store))

    def __len__(self) -> int:
        return len(self.store)

    def document(self, position: int) -> dict[str, str]:
        """The Search-R1 document object for the row at ``position``."""
        return {"id": self.store.doc_id(position), "contents": self.store.contents(position)}


def default_store_root() -> Path:
    """Where converted stores live unless told otherwise: the server's default, ``<index cache>/docstores``."""
    from retriever_server.settings import default_cache_dir

    return default_cache_dir() / "indexes" / "docstores"


def store_key(path: Path, sample_bytes: int = 1 << 20) -> str:
    """A quick key of a corpus file: its resolved path, size, mtime and the hash of its first and last MiB.

    Cheap for a 14 GB wiki-18 file (a full sha256 is computed once, while converting, and kept in the store).
    """
    st = path.stat()
    h = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    with open(path, "rb") as f:
        h.update(f.read(sample_bytes))
        if st.st_size > sample_bytes:
            f.seek(max(sample_bytes, st.st_size - sample_bytes))
            h.update(f.read(sample_bytes))
    return h.hexdigest()[:16]


def load_corpus(path: Path, store_root: Path | None = None, progress: ProgressFn | None = None) -> Corpus:
    """Open a corpus: a store folder as is, or a jsonl(.gz) file through its store under ``store_root`` (converted
    the first time; a file lock keeps two workers from converting it at once).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not JSON, lacks ``contents`` (str), or repeats an id; the message names file and line.
    """
    path = Path(path)
    if path.is_dir():
        return Corpus(store=DocStore(path), path=path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path} (set RETRIEVER_CORPUS_PATH)")
    root = store_root if store_root is not None else default_store_root()
    folder = root / f"{path.name.split('.')[0]}-{store_key(path)}"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        store = DocStore(folder) if (folder / META_FILE).is_file() else convert_jsonl(path, folder, progress)
    return Corpus(store=store, path=path)


def main(argv: list[str] | None = None) -> int:
    """``python -m retriever_server.index.corpus CORPUS``: convert a corpus into its store ahead of the first start."""
    import argparse
    import logging
    import time

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("corpus", type=Path, help="jsonl(.gz) of {id, contents} rows")
    ap.add_argument("--store-dir", type=Path, default=None, help="default: the server's (RETRIEVER_DOCSTORE_DIR)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("retriever_server.index.corpus")
    t0 = time.monotonic()

    def report(stage: str, done: int, total: int) -> None:
        log.info("%s: %.1f of %.1f GB read (%.0fs)", stage, done / 1e9, total / 1e9, time.monotonic() - t0)

    if args.store_dir is None:
        from retriever_server.settings import Settings

        args.store_dir = Settings().docstore_root()
    corpus = load_corpus(args.corpus, args.store_dir, report)
    log.info("%d rows in %s (sha256 %s)", len(corpus), corpus.store.folder, corpus.sha256)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
