"""Fixtures for the retriever tests: a small real corpus cut from the shipped one."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from retriever_server.settings import SHIPPED_CORPUS


def read_shipped_rows(n: int | None = None) -> list[dict[str, str]]:
    rows = []
    with gzip.open(SHIPPED_CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if n is not None and len(rows) >= n:
                break
    return rows


def write_corpus(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def make_corpus(tmp_path: Path) -> Callable[[int], Path]:
    """``make_corpus(n)``: the first ``n`` passages of the shipped corpus (real Wikipedia text) as plain jsonl."""

    def make(n: int) -> Path:
        return write_corpus(tmp_path / f"corpus-{n}.jsonl", read_shipped_rows(n))

    return make


@pytest.fixture
def small_corpus(make_corpus: Callable[[int], Path]) -> Path:
    """The first 300 passages of the shipped corpus."""
    return make_corpus(300)
