"""The QA readers' record types: where a record was read, a usable question, a rejected record and why, and the
error for a whole unreadable file (``data_prep.formats`` reads them, ``data_prep.containers`` decodes files)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Reasons an input record is rejected; ``qa_to_parquet`` adds ``duplicate_id``.
UNREADABLE = "unreadable"
NO_QUESTION = "no_question"
NO_ANSWER = "no_answer"


@dataclass(frozen=True)
class Location:
    """Where a record was read: a line of a JSON-lines file, a record of a JSON array, or a parquet row."""

    path: Path
    line: int | None = None
    """1-based line number (JSON lines)."""
    record: int | None = None
    """1-based position in a JSON array or parquet file (when there are no meaningful line numbers)."""

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.path}:{self.line}"
        if self.record is not None:
            return f"{self.path} (record {self.record})"
        return str(self.path)


@dataclass(frozen=True)
class QARecord:
    """One usable question as read from a file (question text not yet normalised)."""

    question: str
    answers: tuple[str, ...]
    """Gold answers, stripped, empty strings and exact duplicates removed, order kept."""
    native_id: str | None
    """The dataset's own id for this question when the format has one (HotpotQA ``_id``...), else None."""
    where: Location


@dataclass(frozen=True)
class InvalidRecord:
    """A record that cannot be used, with the reason (one of the module constants) and a readable detail."""

    reason: str
    detail: str
    where: Location

    def message(self) -> str:
        return f"{self.where}: {self.reason}: {self.detail}"


Item = QARecord | InvalidRecord
Parser = Callable[[Mapping[str, Any], Location], Item]


class FormatError(ValueError):
    """A whole file cannot be read: unknown extension, undetectable or unknown format, missing columns."""
