"""Corpus text helpers with no heavy imports, for the trainer, data preparation and the index alike: open a
(gzipped) text file, split a wiki-18 ``contents`` string into title and text, hash a file.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import IO


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Streamed sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


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
