"""Corpus loading: ``python -m pytest tests/retriever_server/index/test_corpus.py``."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from retriever_server.index.corpus import load_corpus
from retriever_server.passages import split_contents
from retriever_server.settings import SHIPPED_CORPUS


def test_shipped_corpus_loads_with_unique_ids_and_titles() -> None:
    corpus = load_corpus(SHIPPED_CORPUS)
    assert 16_000 < len(corpus) < 17_000
    assert len(set(corpus.ids)) == len(corpus)
    title, text = split_contents(corpus.contents[0])
    assert title and text and not title.startswith('"')


def test_gz_and_plain_give_the_same_rows_but_hash_the_bytes(tmp_path: Path) -> None:
    plain = tmp_path / "c.jsonl"
    plain.write_text('{"id": "a", "contents": "\\"T\\"\\nx"}\n\n{"id": "b", "contents": "y"}\n')
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_corpus(plain), load_corpus(gz)
    assert a.ids == b.ids == ["a", "b"] and a.contents == b.contents
    assert a.sha256 != b.sha256
    assert a.document(1) == {"id": "b", "contents": "y"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"id": "a", "contents": "x"}\n{oops\n', "c.jsonl:2: not valid JSON"),
        ('{"id": "a", "text": "x"}\n', "c.jsonl:1: row needs a string field 'contents'"),
        ('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n', "c.jsonl:2: duplicate id 'a'"),
        ("\n", "corpus has no documents"),
    ],
)
def test_bad_corpus_rows_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        load_corpus(path)


def test_missing_corpus_says_which_setting(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="RETRIEVER_CORPUS_PATH"):
        load_corpus(tmp_path / "nope.jsonl")


def test_split_contents() -> None:
    assert split_contents('"Paris"\nCapital of France') == ("Paris", "Capital of France")
    assert split_contents('"Say "Hi""\nA song. ') == ('Say "Hi"', "A song.")  # one pair of quotes, text stripped
