"""Warm-start rows from the policy's own right answers (rejection-sampling fine-tuning, also called expert
iteration): ``python -m search_rl.tools.rft_rows --records RUN --questions PARQUET --corpus CORPUS --output OUT``.

``RUN`` is a ``main_eval`` output over training questions, usually sampled (``n_samples=8``); give ``--records``
again to pool several runs (e.g. a second batch of questions). Every sampled trajectory
with exact match 1, only valid search/answer turns, no retriever failure and, when it searched, its answer in a
passage it was shown (or a yes/no judgement, which no passage holds: ``search_rl.sft.trajectories.answer_shown``)
becomes an SFT row in the format
``data_prep.synth_sft`` writes (the question's own row plus ``trajectory`` and ``sft``), its passages looked up by id in
the corpus the retriever serves. ``main_sft`` then trains on them from the policy that sampled them (docs/learning.md).
Identical trajectories of a question are kept once, and at most ``--max-per-question`` per question, so questions
the policy already answers every time do not dominate; ``--without-think`` leaves out trajectories with a
``<think>`` turn (rows with one taught the warm start to think, which lost answers: docs/experiments/). A question's
rows get ids ``<extra_info.id>/rft<k>``
(training rows need unique ids). ``--mix SFT_PARQUET`` appends as many rows again, a seeded sample of an existing
warm-start file (the shipped ``sft_train.parquet``): rejection sampling's best result mixed them one for one.
Every record left out is counted by reason in the manifest written next to the output and in the printed summary.
``--min-rows N`` refuses, writing nothing, when fewer than ``N`` rows qualify (the learning benchmark passes its
fine-tune's batch size: a warm start that thinks in nearly every right sample left 5 rows under ``--without-think``).

Only training questions belong here: the rows teach the answers they contain.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from retriever_server.index.corpus import load_corpus
from retriever_server.passages import split_contents
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.sft.rows import read_input, write_output
from search_rl.sft.trajectories import answer_shown, parse_turns
from search_rl.tags import THINK_OPEN
from search_rl.tools.eval_records import read_records, records_parser, write_manifest

SKIP_REASONS = (
    "not_exact",
    "invalid_action",
    "retriever_error",
    "unfinished",
    "answer_not_shown",
    "bad_format",
    "has_think",
    "duplicate",
    "over_cap",
)
"""Why a record is not turned into a row (each counted). ``answer_not_shown``: the trajectory searched but no
observation it saw holds the answer and it is not yes/no (a guess; ``main_sft`` leaves such examples out too).
``bad_format``: turns that break the tag protocol warm-start rows must keep
(``search_rl.sft.trajectories.parse_turns``), e.g. an unclosed ``<think>``. ``has_think``: a model turn thinks, left
out under ``--without-think``."""


def record_turns(record: dict[str, Any], passages: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The ``trajectory`` value of one evaluation record: each model turn's text, a search turn with the passages
    its query returned (looked up by id), the last turn the answer.

    Raises:
        ValueError: the record's searches do not line up with its model turns, or a passage id is not in the corpus.
    """
    model = [s["text"] for s in record["segments"] if s["kind"] == "model"]
    calls = record["search_calls"]
    where = f"record {record['uid']} sample {record.get('sample', 0)}"
    if len(calls) != len(model) - 1:
        raise ValueError(
            f"{where}: {len(model)} model turns but {len(calls)} searches (expected one per turn but last)"
        )
    turns = []
    for i, text in enumerate(model):
        found = []
        for pid in calls[i]["passage_ids"] if i < len(calls) else ():
            if pid not in passages:
                raise ValueError(
                    f"{where}: passage id {pid!r} is not in the corpus; give the corpus the retriever serves"
                )
            found.append(passages[pid])
        turns.append({"text": text, "passages": found})
    return turns


def skip_reason(record: dict[str, Any]) -> str | None:
    """Why ``record`` cannot be a training row (one of ``SKIP_REASONS`` before deduplication), or None."""
    stats = record["stats"]
    if record["reward_components"]["em"] < 1.0:
        return "not_exact"
    if stats["invalid_actions"] > 0:
        return "invalid_action"
    if stats["retriever_errors"] > 0 or any(c["failed"] for c in record["search_calls"]):
        return "retriever_error"
    if not stats["finished"] or record["stop_reason"] != "answer":
        return "unfinished"
    if not answer_shown([s["text"] for s in record["segments"] if s["kind"] == "observation"], record["answer"] or ""):
        return "answer_not_shown"
    return None


def keeps_protocol(turns: list[dict[str, Any]]) -> bool:
    """Whether ``turns`` pass the checks ``main_sft`` applies to warm-start rows (``parse_turns``)."""
    try:
        parse_turns(turns, "record")
    except ValueError:
        return False
    return True


def build_rows(
    records: list[dict[str, Any]],
    questions: dict[str, dict[str, Any]],
    passages: dict[str, dict[str, str]],
    max_per_question: int,
    without_think: bool = False,
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """(SFT rows, skipped records by reason) from evaluation records, in record order; with ``without_think``,
    trajectories with a ``<think>`` turn are left out before the per-question cap counts.

    Raises:
        ValueError: a record whose question id is not among ``questions``.
    """
    rows: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    seen: dict[str, set[tuple[str, ...]]] = {}
    for record in records:
        uid = record["uid"]
        if uid not in questions:
            raise ValueError(f"record {uid} (sample {record.get('sample', 0)}) is not a question of --questions")
        reason = skip_reason(record)
        if reason is None:
            turns = record_turns(record, passages)
            key = tuple(t["text"] for t in turns)
            kept = seen.setdefault(uid, set())
            if not keeps_protocol(turns):
                reason = "bad_format"
            elif without_think and any(THINK_OPEN in t["text"] for t in turns):
                reason = "has_think"
            elif key in kept:
                reason = "duplicate"
            elif len(kept) >= max_per_question:
                reason = "over_cap"
            else:
                kept.add(key)
                row = copy.deepcopy(questions[uid])
                row["extra_info"]["id"] = f"{uid}/rft{len(kept) - 1}"  # training rows need unique ids
                sft = {
                    "variant": "rft",
                    "num_searches": len(turns) - 1,
                    "answer": record["answer"],
                    "support_passage": "",
                }
                rows.append({**row, "trajectory": turns, "sft": sft})
        if reason is not None:
            skipped[reason] += 1
    return rows, skipped


def mix_rows(path: Path, count: int, seed: int, columns: list[str], taken: set[str]) -> list[dict[str, Any]]:
    """``count`` rows of the SFT file ``path`` (all of them if it has fewer), a seeded sample without replacement in
    ``pandas.DataFrame.sample`` order, to append to rows whose ids are ``taken``.

    Raises:
        ValueError: the file cannot be read, its columns are not ``columns``, or a sampled id is already taken.
    """
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise ValueError(f"cannot read --mix {path}: {e}") from e
    if table.column_names != columns:
        raise ValueError(f"--mix {path} has columns {table.column_names}, expected an SFT file's {columns}")
    picked = pd.Series(range(table.num_rows)).sample(n=min(count, table.num_rows), random_state=seed).tolist()
    rows = table.take(picked).to_pylist()
    for r in rows:
        if r["extra_info"]["id"] in taken:
            raise ValueError(f"--mix {path}: row id {r['extra_info']['id']!r} is also a sampled row's id")
    return rows


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (also used by bench/learning_bench.py's tests to check the arguments it writes)."""
    ap = records_parser(
        "search_rl.tools.rft_rows",
        __doc__,
        records_help="main_eval output folder (sampled on train questions); repeat to pool several",
        min_rows_help="refuse (exit 1, nothing written) when fewer rows qualify, e.g. the fine-tune's batch size "
        "(default 1)",
    )
    ap.add_argument("--corpus", default=SHIPPED_CORPUS, type=Path, help="the served corpus")
    ap.add_argument("--max-per-question", type=int, default=4, help="distinct right trajectories kept per question")
    ap.add_argument("--without-think", action="store_true", help="leave out trajectories with a <think> turn")
    ap.add_argument("--mix", type=Path, help="an SFT parquet to append as many rows from (seeded sample)")
    ap.add_argument("--mix-seed", type=int, default=0, help="seed of the --mix sample (default 0)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.max_per_question < 1:
        ap.error("--max-per-question must be >= 1")
    if args.min_rows < 1:
        ap.error("--min-rows must be >= 1")
    try:
        schema, question_rows = read_input(args.questions)
        records = [r for folder in args.records for r in read_records(folder)]
        corpus = load_corpus(args.corpus)
        passages = {}
        for pid, contents in zip(corpus.ids, corpus.contents, strict=True):
            title, text = split_contents(contents)
            passages[pid] = {"id": pid, "title": title, "text": text}
        questions = {r["extra_info"]["id"]: r for r in question_rows}
        rows, skipped = build_rows(records, questions, passages, args.max_per_question, args.without_think)
        if not rows:
            sys.stderr.write(f"error: no record qualifies (skipped: {dict(skipped)})\n")
            return 1
        covered = len({r["extra_info"]["id"].rsplit("/rft", 1)[0] for r in rows})
        if len(rows) < args.min_rows:
            sys.stderr.write(
                f"error: only {len(rows)} rows of {covered} questions qualify, fewer than --min-rows {args.min_rows}; "
                f"nothing written (skipped: {dict(skipped)}). Sample more questions"
                + (", or keep thinking trajectories (drop --without-think)" if skipped["has_think"] else "")
                + "\n"
            )
            return 1
        mixed = []
        if args.mix is not None:
            columns = [*schema.names, "trajectory", "sft"]
            taken = {r["extra_info"]["id"] for r in rows}
            mixed = mix_rows(args.mix, len(rows), args.mix_seed, columns, taken)
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"error: {e!r}\n" if isinstance(e, KeyError) else f"error: {e}\n")
        return 1
    write_output(rows + mixed, schema, args.output)
    manifest = {
        "description": "search-rl rejection-sampling rows: the policy's own exact trajectories; docs/learning.md",
        "command": "python -m search_rl.tools.rft_rows " + " ".join(argv),
        "records_read": len(records),
        "questions_sampled": len({r["uid"] for r in records}),
        "rows_kept": len(rows),
        "questions_kept": covered,
        "skipped_by_reason": {k: skipped[k] for k in SKIP_REASONS if skipped[k]},
        "per_num_searches": dict(sorted(Counter(str(r["sft"]["num_searches"]) for r in rows).items())),
    }
    if args.mix is not None:
        manifest.update({"mix": str(args.mix), "mix_seed": args.mix_seed, "mixed_rows": len(mixed)})
    manifest_path = write_manifest(args.output, manifest)
    sys.stdout.write(
        f"read {len(records)} records of {manifest['questions_sampled']} questions; kept {len(rows)} rows of "
        f"{covered} questions; skipped {manifest['skipped_by_reason']}; searches {manifest['per_num_searches']}\n"
    )
    if args.mix is not None:
        short = f" (all it has, fewer than the {len(rows)} kept)" if len(mixed) < len(rows) else ""
        sys.stdout.write(f"mixed in {len(mixed)} rows of {args.mix}{short}, seed {args.mix_seed}\n")
    sys.stdout.write(f"wrote {args.output} and {manifest_path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
