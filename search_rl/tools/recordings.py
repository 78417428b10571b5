"""List, inspect and merge retrieval recordings (the SQLite files of ``retriever.recording.path``).

    python -m search_rl.tools.recordings list runs/retrievals.sqlite             # recorded backends and counts
    python -m search_rl.tools.recordings entries runs/retrievals.sqlite --query paris --limit 5
    python -m search_rl.tools.recordings show runs/retrievals.sqlite 3f2a...     # one entry's passages
    python -m search_rl.tools.recordings merge all.sqlite a.sqlite b.sqlite      # copy a's and b's entries into all

A recording holds searches and the documents the ``open`` tool read: ``list`` counts both, ``entries`` lists searches,
``show`` takes a key of either as a rollout record gives it (``search_calls[i].retrieval_key``; a unique prefix is
enough). ``merge`` copies both and keeps the target's entry where both hold a key (the same key is the same query,
top-k and backend, or the same document id, length and backend).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging
from search_rl.rollout.backends import DocumentEntry, Entry, RecordingStore

logger = logging.getLogger(__name__)


def format_entry(entry: Entry, text_chars: int = 300) -> str:
    """An entry as text: key, backend, query, then each passage (id, title, text cut to ``text_chars``)."""
    lines = [f"key {entry.key}  fingerprint {entry.fingerprint}  top-k {entry.topk}", f"query: {entry.query}"]
    for i, p in enumerate(entry.passages, 1):
        text = p.text if len(p.text) <= text_chars else p.text[:text_chars] + "..."
        lines.append(f"  Doc {i} [{p.id}] {p.title}: {text}")
    return "\n".join(lines)


def format_document(entry: DocumentEntry) -> str:
    """An opened document as text: key, backend, id, then the article (or that the backend knew no such id)."""
    p = entry.passage
    head = f"key {entry.key}  fingerprint {entry.fingerprint}  max_chars {entry.max_chars}\nopened: {entry.doc_id}"
    return head + ("\n  (no document has this id)" if p is None else f"\n  [{p.id}] {p.title}: {p.text}")


def find_entry(store: RecordingStore, key: str) -> Entry | DocumentEntry:
    """The search or document entry of ``key`` or of a unique key prefix.

    Raises:
        KeyError: no entry, or a prefix shared by several.
    """
    keys = [key] if store.get_many([key]) or store.get_documents([key]) else store.keys_starting(key)
    if not keys:
        raise KeyError(f"no entry of {store.path} has a key starting with {key!r}")
    if len(keys) > 1:
        raise KeyError(f"several entries of {store.path} have a key starting with {key!r}; give more of it")
    return store.get_many(keys).get(keys[0]) or store.get_documents(keys)[keys[0]]


def _list(store: RecordingStore) -> str:
    rows = store.fingerprints()
    if not rows:
        return f"{store.path}: no recorded backend\n"
    return "".join(f"{fid}  {n:>8} entries  {desc}\n" for fid, desc, n in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="recorded backends (fingerprints) and their entry counts").add_argument("file")
    entries = sub.add_parser("entries", help="entries, newest first")
    entries.add_argument("file")
    entries.add_argument("--fingerprint", help="only this backend's entries")
    entries.add_argument("--query", help="only queries containing this text (case-insensitive)")
    entries.add_argument("--limit", type=int, default=20)
    entries.add_argument("--json", action="store_true", help="one JSON object per line")
    show = sub.add_parser("show", help="one entry's passages (a search) or article (an opened document)")
    show.add_argument("file")
    show.add_argument("key", help="a retrieval or document key, or a unique prefix of one")
    merge = sub.add_parser("merge", help="copy the entries of other recordings into a target (created if missing)")
    merge.add_argument("target")
    merge.add_argument("sources", nargs="+")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    try:
        if args.command == "merge":
            store = RecordingStore(args.target)
            for source in args.sources:
                if not Path(source).is_file():
                    raise FileNotFoundError(f"no recording at {source}")
                logger.info("%s: %d entries added to %s", source, store.merge_from(source), args.target)
            sys.stdout.write(_list(store))
            return 0
        store = RecordingStore(args.file, read_only=True)
        if args.command == "list":
            sys.stdout.write(_list(store))
        elif args.command == "show":
            entry = find_entry(store, args.key)
            text = format_entry(entry, 10**6) if isinstance(entry, Entry) else format_document(entry)
            sys.stdout.write(text + "\n")
        else:
            for e in store.entries(args.fingerprint, args.query, args.limit):
                if args.json:
                    passages = [{"id": p.id, "title": p.title, "text": p.text, "score": p.score} for p in e.passages]
                    row = {"key": e.key, "fingerprint": e.fingerprint, "query": e.query, "topk": e.topk}
                    sys.stdout.write(json.dumps({**row, "passages": passages}, ensure_ascii=False) + "\n")
                else:
                    sys.stdout.write(format_entry(e) + "\n\n")
    except (FileNotFoundError, KeyError) as e:
        logger.error("%s", e.args[0] if isinstance(e, KeyError) else e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
