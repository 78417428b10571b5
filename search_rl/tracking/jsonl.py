"""Reading the JSON-lines files the trainer writes: metrics, rollout dumps, evaluation trajectories.

The writers keep model text as it is (``ensure_ascii=False``), so a record may hold characters such as U+2028 that
``str.splitlines()`` treats as line breaks. Records are therefore split on ``"\\n"`` only, here, in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line)`` for every non-blank line of ``path`` (1-based, split on ``"\\n"`` only)."""
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if line.strip():
            yield number, line


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
