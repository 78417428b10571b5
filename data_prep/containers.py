"""File containers of the QA readers: ``.jsonl`` (one object a line), ``.json`` (a JSON array of objects, or JSON
lines), ``.parquet``; ``.gz`` decompressed on the fly. Each yields (location, mapping | ``InvalidRecord``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import pyarrow.parquet as pq

from data_prep.records import UNREADABLE, FormatError, InvalidRecord, Location
from retriever_server.passages import open_text

Decoded = tuple[Location, Mapping[str, Any] | InvalidRecord]


def container_kind(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    if ext in (".jsonl", ".json", ".parquet"):
        return ext[1:]
    raise FormatError(
        f"{path}: unknown file type {ext or '(none)'!r}; expected .jsonl, .json or .parquet (optionally .gz)"
    )


def _decode_jsonl(path: Path, f: IO[str]) -> Iterator[Decoded]:
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        where = Location(path, line=lineno)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield where, InvalidRecord(UNREADABLE, f"not valid JSON ({e.msg} at column {e.colno})", where)
            continue
        if not isinstance(obj, dict):
            yield where, InvalidRecord(UNREADABLE, f"expected a JSON object, got a {type(obj).__name__}", where)
            continue
        yield where, obj


def _decode_json(path: Path) -> Iterator[Decoded]:
    with open_text(path) as f:
        head = f.read(1)
        while head and head.isspace():
            head = f.read(1)
        f.seek(0)
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            if head == "{":  # many ".json" files are really JSON lines; read them as such
                f.seek(0)
                yield from _decode_jsonl(path, f)
                return
            raise FormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); the whole file is unreadable") from e
    if isinstance(data, dict) and isinstance(data.get("Data"), list):
        data = data["Data"]  # the official TriviaQA files wrap their records
    if isinstance(data, dict):
        keys = sorted(data)[:5]
        raise FormatError(
            f"{path}: holds one JSON object (keys {keys}...), not a list of QA records or JSON lines; "
            "a title -> sentences mapping is a passage corpus, which goes through data_prep.build_corpus"
        )
    if not isinstance(data, list):
        raise FormatError(f"{path}: holds a JSON {type(data).__name__}, not a list of QA records")
    for i, obj in enumerate(data, start=1):
        where = Location(path, record=i)
        if isinstance(obj, dict):
            yield where, obj
        else:
            yield where, InvalidRecord(UNREADABLE, f"expected a JSON object, got a {type(obj).__name__}", where)


def _decode_parquet(path: Path) -> Iterator[Decoded]:
    table = pq.read_table(path)
    for i, row in enumerate(table.to_pylist(), start=1):
        yield Location(path, record=i), row


def decode(path: Path) -> Iterator[Decoded]:
    """Yield (location, record) for every record of a .jsonl/.json/.parquet file; bad records as InvalidRecord."""
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    kind = container_kind(path)
    if kind == "parquet":
        yield from _decode_parquet(path)
    elif kind == "json":
        yield from _decode_json(path)
    else:
        with open_text(path) as f:
            yield from _decode_jsonl(path, f)
