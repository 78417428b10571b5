"""Reading JSON-lines files: the trainer's metrics, rollout dumps and evaluation trajectories, and raw QA/corpus files.

The writers keep model text as it is (``ensure_ascii=False``), so a record may hold characters such as U+2028 that
``str.splitlines()`` treats as line breaks. Records are therefore split on newlines only, here, in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from retriever_server.passages import open_text


def jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line)`` for every non-blank line of ``path`` (1-based; ``.gz`` read decompressed).

    Streams the file: its lines end at ``\\n``, ``\\r\\n`` or ``\\r`` only (JSON escapes both inside strings),
    never at U+2028 and the other characters ``str.splitlines()`` also breaks on."""
    with open_text(path) as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line.rstrip("\n")


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, record)`` for every non-blank line; a line that is not JSON raises naming file and line."""
    for number, line in jsonl_lines(path):
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from None


def read_jsonl(path: Path) -> list[Any]:
    """Every record of a JSON-lines file, in order (see :func:`iter_jsonl` for errors)."""
    return [record for _, record in iter_jsonl(path)]
