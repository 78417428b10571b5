"""Build the shipped default Wikipedia corpus from the raw passage files.

Reads every passage in the raw snapshot (its ``SOURCES.md`` lists the files), de-duplicates it by
(title, whitespace-normalised text) and writes wiki-18 style jsonl rows::

    {"id": "0", "contents": "\\"Title\\"\\ntext"}

Ids are consecutive integers in order of first appearance over a fixed source order, so a rebuild from the
same files gives byte-identical output. The raw snapshot is not part of the repository (the shipped corpus is);
maintainers who have it run::

    python -m data_prep.build_corpus --raw <raw snapshot folder>  # --out data/corpus/wiki_mini.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retriever_server.passages import open_text, split_contents
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.tracking.jsonl import iter_jsonl

DEFAULT_OUT = SHIPPED_CORPUS


@dataclass(frozen=True)
class Passage:
    """One Wikipedia passage and the raw file it came from."""

    title: str
    text: str
    source: str


def read_json(path: Path) -> Any:
    with open_text(path) as f:
        return json.load(f)


def _nq_oracle(path: Path) -> Iterator[Passage]:
    for _, row in iter_jsonl(path):
        for ctx in row["ctxs"]:
            yield Passage(ctx["title"], ctx["text"], path.name)


def _ircot_hotpotqa(path: Path) -> Iterator[Passage]:
    for _, row in iter_jsonl(path):
        for ctx in row["contexts"]:
            yield Passage(ctx["title"], ctx["paragraph_text"], path.name)


def _title_to_sentences(path: Path) -> Iterator[Passage]:
    for title, sentences in read_json(path).items():
        yield Passage(title, "".join(sentences), path.name)


def _title_text_list(path: Path) -> Iterator[Passage]:
    for row in read_json(path):
        yield Passage(row["title"], row["text"], path.name)


def _title_text_jsonl(path: Path) -> Iterator[Passage]:
    for _, row in iter_jsonl(path):
        yield Passage(row["title"], row["text"], path.name)


def _wiki18(path: Path) -> Iterator[Passage]:
    for _, row in iter_jsonl(path):
        title, text = split_contents(row["contents"])
        yield Passage(title, text, path.name)


# Fixed order: it decides the ids. Each entry is (file under raw/, reader).
SOURCES: list[tuple[str, Callable[[Path], Iterator[Passage]]]] = [
    ("nelson-liu__lost-in-the-middle/nq-open-oracle.jsonl.gz", _nq_oracle),
    ("xindili-cmu__anlp-project-multihop/dev_subsampled.jsonl.gz", _ircot_hotpotqa),
    ("OSU-NLP-Group__HippoRAG/hotpotqa_train_corpus.json", _title_to_sentences),
    ("OSU-NLP-Group__HippoRAG/musique_train_corpus.json", _title_text_list),
    ("OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json.gz", _title_text_list),
    ("PeterGriffinJin__Search-R1/corpus.jsonl", _wiki18),
    ("extra_passages/passages.jsonl.gz", _title_text_jsonl),
]

_WS = re.compile(r"\s+")


def normalise(s: str) -> str:
    """Collapse runs of whitespace and strip; used for the text we write and for the de-dup key."""
    return _WS.sub(" ", s).strip()


def build_corpus(raw: Path) -> tuple[list[dict[str, str]], dict[str, Counter[str]]]:
    """Read all sources under ``raw`` and return (rows, per-source counts of read/kept/duplicate/empty)."""
    seen: set[tuple[str, str]] = set()
    rows: list[dict[str, str]] = []
    stats: dict[str, Counter[str]] = {}
    for rel, reader in SOURCES:
        path = raw / rel
        if not path.exists():
            raise FileNotFoundError(f"corpus source missing: {path} (expected by data_prep.build_corpus.SOURCES)")
        counts: Counter[str] = Counter()
        for p in reader(path):
            counts["read"] += 1
            title, text = normalise(p.title), normalise(p.text)
            if not title or not text:
                counts["skipped_empty"] += 1
                continue
            key = (title, text)
            if key in seen:
                counts["duplicate"] += 1
                continue
            seen.add(key)
            rows.append({"id": str(len(rows)), "contents": f'"{title}"\n{text}'})
            counts["kept"] += 1
        stats[rel] = counts
    return rows, stats


def write_jsonl(rows: list[dict[str, str]], out: Path) -> None:
    """Write rows as jsonl (gzip if ``out`` ends in .gz, with a fixed mtime so rebuilds are byte-identical)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    if out.suffix == ".gz":
        with open(tmp, "wb") as raw_f, gzip.GzipFile(filename="", fileobj=raw_f, mode="wb", mtime=0) as f:
            f.write(payload)
    else:
        tmp.write_bytes(payload)
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, required=True, help="folder holding the raw snapshot (not in the repository)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output jsonl or jsonl.gz (default: %(default)s)")
    args = ap.parse_args(argv)
    rows, stats = build_corpus(args.raw)
    write_jsonl(rows, args.out)
    for rel, c in stats.items():
        print(f"{rel}: read={c['read']} kept={c['kept']} duplicate={c['duplicate']} skipped_empty={c['skipped_empty']}")
    print(f"wrote {len(rows)} passages to {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
