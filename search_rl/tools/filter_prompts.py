"""Training prompts the policy solves sometimes but not always:
``python -m search_rl.tools.filter_prompts --records RUN --questions PARQUET --output OUT``.

``RUN`` is a ``main_eval`` output over training questions sampled ``k`` times (``n_samples=k``, temperature 1); give
``--records`` again to pool several runs. A question whose ``k`` samples are all right or all wrong gives GRPO a group
of equal rewards, which has no advantage and teaches nothing; this keeps the question rows (the parquet ``main_ppo``
reads, ``data.train_files``) with at least ``--min-right`` exactly right samples and at least ``--min-wrong`` wrong
ones (both 1 by default: strictly between 0 and ``k`` right), in the file's order and schema. Every question of
``--questions`` is counted under one reason in the manifest written next to the output and in the printed summary:
``kept``, ``too_few_right`` (by default: never solved), ``too_few_wrong`` (always solved) or ``not_sampled`` (no
record), with the number of questions by right samples out of samples (``"1/4"``).

Only training questions belong here: the filter reads the policy's answers to them.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from search_rl.sft.rows import read_input
from search_rl.tools.eval_records import read_records, records_parser, write_manifest

REASONS = ("kept", "too_few_right", "too_few_wrong", "not_sampled")
"""Where each question goes. ``too_few_right``: fewer than ``--min-right`` exactly right samples (with the default 1:
never solved); ``too_few_wrong``: fewer than ``--min-wrong`` wrong ones (always solved); ``not_sampled``: no record
of the question in the runs read."""


def right_counts(runs: list[tuple[Path, list[dict[str, Any]]]]) -> dict[str, tuple[int, int]]:
    """Question id -> (exactly right samples, samples) over the records of every run, each given with its folder.

    Raises:
        ValueError: a record without ``uid`` or ``reward_components.em``, or one sample of a question recorded twice
            in the same run, named by folder and record.
    """
    counts: dict[str, tuple[int, int]] = {}
    for folder, records in runs:
        seen: set[tuple[str, int]] = set()
        for i, record in enumerate(records):
            try:
                uid, em = str(record["uid"]), float(record["reward_components"]["em"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{folder} record {i}: needs uid and reward_components.em ({e!r}); give a main_eval output"
                ) from e
            key = (uid, int(record.get("sample", 0)))
            if key in seen:
                raise ValueError(f"{folder} record {i}: question {uid} sample {key[1]} is recorded twice")
            seen.add(key)
            right, samples = counts.get(uid, (0, 0))
            counts[uid] = (right + (em >= 1.0), samples + 1)
    return counts


def reason_for(right: int, samples: int, min_right: int, min_wrong: int) -> str:
    """The ``REASONS`` entry of a question with ``right`` exactly right answers among ``samples`` (0: not sampled).

    >>> [reason_for(r, 4, 1, 1) for r in (0, 1, 3, 4)]
    ['too_few_right', 'kept', 'kept', 'too_few_wrong']
    >>> reason_for(0, 0, 1, 1)
    'not_sampled'
    """
    if samples == 0:
        return "not_sampled"
    if right < min_right:
        return "too_few_right"
    if samples - right < min_wrong:
        return "too_few_wrong"
    return "kept"


def filter_rows(
    rows: list[dict[str, Any]], counts: dict[str, tuple[int, int]], min_right: int, min_wrong: int
) -> tuple[list[dict[str, Any]], Counter[str], Counter[str]]:
    """(kept rows in input order, questions by reason, sampled questions by ``"right/samples"``).

    Raises:
        ValueError: a sampled question id that is not a row of ``rows`` (the records are of other questions).
    """
    ids = {r["extra_info"]["id"] for r in rows}
    unknown = sorted(set(counts) - ids)
    if unknown:
        raise ValueError(
            f"{len(unknown)} sampled question(s) are not rows of --questions, e.g. {unknown[:3]}; "
            "give the parquet the evaluation read"
        )
    kept: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    by_right: Counter[str] = Counter()
    for row in rows:
        right, samples = counts.get(row["extra_info"]["id"], (0, 0))
        reason = reason_for(right, samples, min_right, min_wrong)
        reasons[reason] += 1
        if samples:
            by_right[f"{right}/{samples}"] += 1
        if reason == "kept":
            kept.append(row)
    return kept, reasons, by_right


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    ap = records_parser(
        "search_rl.tools.filter_prompts",
        __doc__,
        records_help="main_eval output folder (training questions, n_samples > 1); repeat to pool several",
        min_rows_help="refuse (exit 1, nothing written) when fewer questions are kept, e.g. data.train_batch_size",
    )
    ap.add_argument("--min-right", type=int, default=1, help="keep questions with at least this many right samples")
    ap.add_argument("--min-wrong", type=int, default=1, help="... and at least this many wrong ones (default 1)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    args = ap.parse_args(argv)
    for flag, value in (
        ("--min-right", args.min_right),
        ("--min-wrong", args.min_wrong),
        ("--min-rows", args.min_rows),
    ):
        if value < 1:
            ap.error(f"{flag} must be >= 1 (got {value})")
    folders = [p.resolve() for p in args.records]
    if len(set(folders)) < len(folders):
        ap.error("a --records folder is given twice; its samples would be counted twice")
    try:
        schema, rows = read_input(args.questions)
        runs = [(folder, read_records(folder)) for folder in args.records]
        counts = right_counts(runs)
        kept, reasons, by_right = filter_rows(rows, counts, args.min_right, args.min_wrong)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    summary = {k: reasons[k] for k in REASONS}
    if len(kept) < args.min_rows:
        sys.stderr.write(
            f"error: {len(kept)} questions kept, fewer than --min-rows {args.min_rows}; nothing written ({summary})\n"
        )
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(kept, schema=schema), tmp, compression="zstd")
    tmp.replace(args.output)
    manifest = {
        "description": "search-rl training prompts the sampling policy solves sometimes but not always",
        "command": "python -m search_rl.tools.filter_prompts " + " ".join(argv),
        "records": [str(p) for p in args.records],
        "records_read": sum(len(r) for _, r in runs),
        "questions_in_file": len(rows),
        "min_right": args.min_right,
        "min_wrong": args.min_wrong,
        "questions_by_reason": summary,
        "questions_by_right_samples": dict(sorted(by_right.items(), key=lambda kv: tuple(map(int, kv[0].split("/"))))),
    }
    manifest_path = write_manifest(args.output, manifest)
    sys.stdout.write(
        f"read {manifest['records_read']} records of {len(counts)} questions; of {len(rows)} questions: {summary}; "
        f"by right/samples {manifest['questions_by_right_samples']}\nwrote {args.output} and {manifest_path}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
