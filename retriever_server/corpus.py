"""The document collection a retriever serves: jsonl rows ``{"id", "contents"}`` held in memory by position."""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass(frozen=True)
class Corpus:
    """Documents in file order; retrievers return positions into these lists."""

    ids: list[str]
    contents: list[str]
    sha256: str
    """Hash of the corpus file's bytes: part of the index cache key."""
    path: Path

    def __len__(self) -> int:
        return len(self.ids)

    def document(self, position: int) -> dict[str, str]:
        """The Search-R1 document object for the row at ``position``."""
        return {"id": self.ids[position], "contents": self.contents[position]}


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Streamed sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def load_corpus(path: Path) -> Corpus:
    """Read a jsonl or jsonl.gz corpus.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not JSON, lacks ``contents`` (str), or repeats an id; the message names file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path} (set RETRIEVER_CORPUS_PATH)")
    ids: list[str] = []
    contents: list[str] = []
    seen: set[str] = set()
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            text = row.get("contents") if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: row needs a string field 'contents'")
            doc_id = str(row.get("id", len(ids)))
            if doc_id in seen:
                raise ValueError(f"{path}:{lineno}: duplicate id {doc_id!r}")
            seen.add(doc_id)
            ids.append(doc_id)
            contents.append(text)
    if not ids:
        raise ValueError(f"{path}: corpus has no documents")
    return Corpus(ids=ids, contents=contents, sha256=file_sha256(path), path=path)


def open_text(path: Path) -> IO[str]:
    """Open a UTF-8 text file for reading, gzip-decompressed when its name ends in ``.gz``."""
    path = Path(path)
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a wiki-18 ``contents`` string ``"Title"\\ntext``: the first line without its pair of quotes,
    and the rest, both stripped. Without a newline the whole string is the title and the text is empty.

    >>> split_contents('"Paris"\\nParis is the capital of France.')
    ('Paris', 'Paris is the capital of France.')
    >>> split_contents('"Say "Hi""\\nA song.')[0], split_contents("just text")
    ('Say "Hi"', ('just text', ''))
    """
    first, _, rest = contents.partition("\n")
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, rest.strip()
