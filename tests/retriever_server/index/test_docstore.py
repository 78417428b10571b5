"""The memory-mapped document store: ``python -m pytest tests/retriever_server/index/test_docstore.py``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from retriever_server.index.corpus import load_corpus
from retriever_server.index.docstore import DocStore, convert_jsonl, slice_store
from retriever_server.passages import file_sha256

ROWS = [
    {"id": "a", "contents": '"Zürich"\nA city — 🏔️ in Switzerland.'},
    {"id": "b", "contents": ""},
    {"contents": "no id: gets its row number"},
    {"id": 7, "contents": "numeric id becomes text"},
]


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_rows_round_trip_by_position_and_hash_is_of_the_file(tmp_path: Path) -> None:
    src = write(tmp_path / "c.jsonl", ROWS)
    store = convert_jsonl(src, tmp_path / "store")
    assert len(store) == 4
    assert [store.doc_id(i) for i in range(4)] == ["a", "b", "2", "7"]
    assert [store.contents(i) for i in range(4)] == [r["contents"] for r in ROWS]
    assert store.sha256 == file_sha256(src)
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    from_gz = convert_jsonl(gz, tmp_path / "store-gz")
    assert from_gz.sha256 == file_sha256(gz) != store.sha256
    assert [from_gz.contents(i) for i in range(4)] == [store.contents(i) for i in range(4)]


def test_corpus_reads_through_the_store_and_reuses_it(tmp_path: Path) -> None:
    src = write(tmp_path / "c.jsonl", ROWS)
    root = tmp_path / "stores"
    corpus = load_corpus(src, root)
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    assert corpus.store.folder == folder
    assert corpus.document(0) == {"id": "a", "contents": ROWS[0]["contents"]}
    assert corpus.ids == ["a", "b", "2", "7"] and corpus.contents[-1] == "numeric id becomes text"
    assert corpus.contents[1:3] == ["", "no id: gets its row number"]
    with pytest.raises(IndexError, match="outside a corpus of 4 rows"):
        corpus.contents[4]
    stamp = (folder / "contents.bin").stat().st_mtime_ns
    again = load_corpus(src, root)
    assert again.store.folder == folder and (folder / "contents.bin").stat().st_mtime_ns == stamp  # not converted
    write(src, ROWS[:2])  # a changed file gets a store of its own
    changed = load_corpus(src, root)
    assert changed.store.folder != folder and len(changed) == 2
    assert len(load_corpus(folder)) == 4  # a store folder is a corpus path too


def test_duplicate_id_names_the_second_line_among_many(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [{"id": str(i), "contents": f"p{i}"} for i in range(5000)]
    rows.insert(3000, {"id": "1234", "contents": "again"})
    src = write(tmp_path / "c.jsonl", rows)
    with pytest.raises(ValueError, match=r"c.jsonl:3001: duplicate id '1234'"):
        convert_jsonl(src, tmp_path / "store")
    assert not list(tmp_path.glob("store*")), "a failed conversion leaves nothing behind"


def test_damaged_store_is_refused(tmp_path: Path) -> None:
    store = convert_jsonl(write(tmp_path / "c.jsonl", ROWS), tmp_path / "store")
    np.save(store.folder / "ids.idx.npy", np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="offsets hold 2 rows, STORE.json says 4"):
        DocStore(store.folder)
    with pytest.raises(FileNotFoundError, match="not a document store"):
        DocStore(tmp_path)


def test_a_slice_is_a_store_of_its_rows(tmp_path: Path) -> None:
    store = convert_jsonl(write(tmp_path / "c.jsonl", ROWS), tmp_path / "store")
    part = slice_store(store, 1, 4, tmp_path / "part")
    assert [part.doc_id(i) for i in range(3)] == ["b", "2", "7"]
    assert [part.contents(i) for i in range(3)] == [r["contents"] for r in ROWS[1:]]
    assert part.sha256 != store.sha256
    with pytest.raises(ValueError, match="rows 3:9 are not a range of a store of 4 rows"):
        slice_store(store, 3, 9, tmp_path / "bad")
