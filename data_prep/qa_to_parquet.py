"""Convert QA files (FlashRAG, NQ-open, HotpotQA, IRCoT, MuSiQue, R1-Searcher, Search-R1 parquet) to training parquet.

Usage (this command line is stable; scripts depend on it)::

    python -m data_prep.qa_to_parquet --input nq=NQ-open.dev.jsonl --input hotpotqa=hotpot_dev.json \\
        --split test --out data/my_test.parquet [--format auto] [--skip-invalid] [--template search] \\
        [--tokenizer PATH_OR_NAME --max-prompt-length 512]

Each ``--input SOURCE=PATH`` names the data source of one file (``nq``, ``hotpotqa``, ``musique``, or any name);
the source becomes the row's ``data_source`` and the prefix of its id. The file format is detected from the first
record (see :mod:`data_prep.formats`) unless ``--format`` names it for every input.

A record with no question or no answer, a duplicate id, or an unreadable line stops the run with an error naming
the file and line. With ``--skip-invalid`` such records are skipped instead and counted per reason; nothing is
dropped without being counted. Questions are normalised as :mod:`data_prep.rows` describes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.formats import (
    FORMAT_NAMES,
    NO_QUESTION,
    FormatError,
    InvalidRecord,
    Location,
    detect_file_format,
    read_records,
)
from data_prep.rows import (
    SPLITS,
    check_source_name,
    make_row,
    make_row_id,
    normalise_question,
    question_key,
    write_rows,
)
from search_rl.templates import Template, load_template, render_prompt

DUPLICATE_ID = "duplicate_id"


@dataclass(frozen=True)
class InputSpec:
    """One ``--input SOURCE=PATH``."""

    source: str
    path: Path
    fmt: str | None = None
    """Format name, or None to detect it."""

    @classmethod
    def parse(cls, text: str, fmt: str | None = None) -> InputSpec:
        """Parse ``SOURCE=PATH``.

        Raises:
            ValueError: no ``=``, or an unusable source name.
        """
        source, sep, path = text.partition("=")
        if not sep or not source or not path:
            raise ValueError(f"--input {text!r}: expected SOURCE=PATH, e.g. --input nq=NQ-open.dev.jsonl")
        return cls(check_source_name(source), Path(path), fmt)


class InvalidRowError(ValueError):
    """A record cannot become a row; the message names the file and line (or record)."""


@dataclass
class ConversionReport:
    """What a conversion read, wrote and skipped."""

    written: Counter[str] = field(default_factory=Counter)
    """Rows written per data source."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Records skipped per reason (only with ``skip_invalid``)."""
    formats: dict[str, str] = field(default_factory=dict)
    """Detected or given format per input path."""
    examples: dict[str, str] = field(default_factory=dict)
    """First skipped record per reason, as ``file:line: reason: detail``."""

    def describe(self) -> str:
        lines = [f"{path}: format {fmt}" for path, fmt in self.formats.items()]
        lines += [f"wrote {n} rows for data_source={src}" for src, n in sorted(self.written.items())]
        for reason, n in sorted(self.skipped.items()):
            lines.append(f"skipped {n} records: {reason} (first: {self.examples[reason]})")
        return "\n".join(lines)


@dataclass(frozen=True)
class Question:
    """A validated question, normalised, ready to become a row in any split."""

    source: str
    question: str
    answers: tuple[str, ...]
    native_id: str | None
    where: Location

    @property
    def key(self) -> str:
        """Split-independent key: the native id, or the question's hash key (see :mod:`data_prep.rows`)."""
        return self.native_id if self.native_id is not None else question_key(self.question)


def collect(inputs: Sequence[InputSpec], report: ConversionReport, *, skip_invalid: bool = False) -> list[Question]:
    """Read, validate and normalise every input's questions, in input order then file order.

    Raises:
        InvalidRowError: a bad record (no question, no answer, unreadable, duplicate id), unless ``skip_invalid``,
            in which case it is counted in ``report.skipped`` instead.
        FormatError: a file cannot be read at all (missing, unknown type, format not detectable, no records).
    """
    questions: list[Question] = []
    first_seen: dict[tuple[str, str], Location] = {}

    def reject(bad: InvalidRecord) -> None:
        if not skip_invalid:
            raise InvalidRowError(bad.message() + " (use --skip-invalid to skip and count such records)")
        report.skipped[bad.reason] += 1
        report.examples.setdefault(bad.reason, bad.message())

    for spec in inputs:
        fmt = spec.fmt or detect_file_format(spec.path)
        report.formats[str(spec.path)] = fmt if spec.fmt else f"{fmt} (detected)"
        n_records = 0
        for item in read_records(spec.path, fmt):
            n_records += 1
            if isinstance(item, InvalidRecord):
                reject(item)
                continue
            q = Question(spec.source, normalise_question(item.question), item.answers, item.native_id, item.where)
            if not q.question:  # formats reject blank questions already; kept as a guard on the policy
                reject(InvalidRecord(NO_QUESTION, "question is empty after normalisation", item.where))
                continue
            if (q.source, q.key) in first_seen:
                reject(
                    InvalidRecord(
                        DUPLICATE_ID,
                        f"source {q.source!r} id {q.key!r} was already used by {first_seen[q.source, q.key]}",
                        item.where,
                    )
                )
                continue
            first_seen[q.source, q.key] = item.where
            questions.append(q)
        if n_records == 0:
            raise FormatError(f"{spec.path}: the file holds no records")
    return questions


def check_split_and_template(split: str, template: Template) -> None:
    """Raise ValueError unless ``split`` is known and ``template`` can be filled without passages."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    if template.needs_passages:
        raise ValueError(
            f"template {template.path} has a {{passages}} slot, which is filled at evaluation time "
            "from the retriever; build the parquet with a template without it (search, no_search). "
            "Rows keep the bare question in the 'question' column for that baseline."
        )


def build_rows(questions: Sequence[Question], split: str, template: Template) -> list[dict[str, Any]]:
    """Turn questions into Search-R1 rows of one split; ``extra_info.index`` is the row's position.

    Raises:
        ValueError: bad split, a template that needs passages, or two questions with the same id.
    """
    check_split_and_template(split, template)
    rows: list[dict[str, Any]] = []
    for q in questions:
        rows.append(
            make_row(
                source=q.source,
                split=split,
                index=len(rows),
                row_id=make_row_id(q.source, split, q.question, q.native_id),
                question=q.question,
                answers=q.answers,
                prompt=render_prompt(template, q.question),
            )
        )
    repeated = [i for i, n in Counter(r["extra_info"]["id"] for r in rows).items() if n > 1]
    if repeated:
        raise ValueError(f"row ids occur more than once: {repeated[:5]}; each (source, question id) must be unique")
    return rows


def convert(
    inputs: Sequence[InputSpec],
    split: str,
    template: Template,
    *,
    skip_invalid: bool = False,
) -> tuple[list[dict[str, Any]], ConversionReport]:
    """Read every input and build Search-R1 rows of one split: :func:`collect` then :func:`build_rows`.

    Returns:
        The rows and the report (formats, rows written per source, records skipped per reason).

    Raises:
        InvalidRowError: a bad record, unless ``skip_invalid``.
        FormatError: a file cannot be read at all.
        ValueError: bad split or template.
    """
    check_split_and_template(split, template)  # before reading any file
    report = ConversionReport()
    rows = build_rows(collect(inputs, report, skip_invalid=skip_invalid), split, template)
    report.written.update(r["data_source"] for r in rows)
    return rows, report


def _build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.qa_to_parquet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SOURCE=PATH",
        help="a QA file and its data source name; repeat for several files",
    )
    ap.add_argument("--split", required=True, choices=SPLITS, help="split recorded in every row and id")
    ap.add_argument("--out", required=True, type=Path, help="output .parquet file")
    ap.add_argument(
        "--format",
        default="auto",
        choices=("auto", *FORMAT_NAMES),
        help="input format of every input (default: detect per file)",
    )
    ap.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip bad records and print a count per reason instead of stopping at the first",
    )
    ap.add_argument(
        "--template",
        default="search",
        help="prompt template: a name under configs/templates/ or a file path (default: search)",
    )
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="report prompt lengths in tokens of this tokenizer (folder, hub name or .gguf file)",
    )
    ap.add_argument(
        "--max-prompt-length",
        type=int,
        default=None,
        help="with --tokenizer: count rows whose prompt is longer than this many tokens",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _build_parser()
    args = ap.parse_args(argv)
    if args.max_prompt_length is not None and args.tokenizer is None:
        ap.error("--max-prompt-length needs --tokenizer")
    fmt = None if args.format == "auto" else args.format
    try:
        inputs = [InputSpec.parse(text, fmt) for text in args.input]
        template = load_template(args.template)
        rows, report = convert(inputs, args.split, template, skip_invalid=args.skip_invalid)
    except ValueError as e:  # InvalidRowError and FormatError included: a message for the user, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(report.describe())
    if not rows:
        print("error: no valid rows; nothing written", file=sys.stderr)
        return 1
    write_rows(rows, args.out)
    print(f"wrote {len(rows)} rows to {args.out} (template {template.name}, split {args.split})")
    if args.tokenizer:
        from data_prep.prompt_lengths import load_tokenizer, prompt_length_stats

        stats = prompt_length_stats([r["prompt"] for r in rows], load_tokenizer(args.tokenizer), args.max_prompt_length)
        print(stats.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
