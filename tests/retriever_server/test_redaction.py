"""``without_paths``: what callers of ``/health`` and 503 answers see of a message that names files.

Run: python -m pytest tests/retriever_server/test_redaction.py -q
"""

from __future__ import annotations

import pytest

from retriever_server.redaction import without_paths


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("FileNotFoundError: /data/wiki/corpus.jsonl", "FileNotFoundError: corpus.jsonl"),
        ("cannot read ~/indexes/e5.faiss: truncated", "cannot read e5.faiss: truncated"),
        ("model '/home/ann/models/all-MiniLM-L6-v2' missing", "model 'all-MiniLM-L6-v2' missing"),
        ("/a/b.jsonl and /c/d.jsonl differ", "b.jsonl and d.jsonl differ"),
    ],
)
def test_absolute_paths_are_cut_to_their_last_part(message: str, shown: str):
    assert without_paths(message) == shown


@pytest.mark.parametrize(
    "message",
    [
        "see http://example.org/docs/setup for help",
        "relative data/corpus.jsonl stays",
        "sentence-transformers/all-MiniLM-L6-v2",
        "ratio 3/4 of the shards",
        "",
    ],
)
def test_urls_relative_paths_and_model_ids_are_kept(message: str):
    assert without_paths(message) == message


def test_a_bare_root_is_kept():
    assert without_paths("wrote to /") == "wrote to /"
