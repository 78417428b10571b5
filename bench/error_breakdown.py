"""Where evaluations lose their answers, recomputed from their records (so older evaluations count too).

    python bench/error_breakdown.py NAME=EVAL_DIR [NAME=EVAL_DIR ...]

``EVAL_DIR``: a ``main_eval`` output folder (or the ``output_dir`` holding such runs: the newest is read). Prints one
Markdown table, a row per evaluation, from each record's first sample: EM per data source; how many trajectories
searched twice or more; the yes/no questions (every gold yes or no, ``search_stats.yes_no_question``): how many,
how many the policy answered yes or no at all, how many it got right; and the read-wrong answers (a gold answer was
shown) by where the answer came from (``search_stats.answer_source``: the gold's passage, another passage, none; taken
from the record, or recomputed from its observation text for records written before it existed). The last line is
machine-readable.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from typing import Any

from search_rl.reward import is_judgement
from search_rl.reward.search_stats import ANSWER_SOURCE_LABELS, ANSWER_SOURCES, answer_source, yes_no_question
from search_rl.tools.compare_evals import parse_spec, run_folder
from search_rl.tracking.jsonl import read_jsonl

_DOC_HEADER = re.compile(r"Doc \d+\(Title: ")
"""The header before each passage of an observation (``search_rl.tags``), where the passages split."""


def read_wrong_source(record: dict[str, Any]) -> str:
    """Where a read-wrong record's answer came from: its ``answer_source``, or recomputed from its observations."""
    if record.get("answer_source"):
        return str(record["answer_source"])
    shown = "".join(s["text"] for s in record["segments"] if s["kind"] == "observation")
    return answer_source(record["answer"], _DOC_HEADER.split(shown)[1:], record["gold"])


def breakdown(records: list[dict[str, Any]]) -> dict[str, float]:
    """Counts and rates of one evaluation's first-sample records (keys as in the table)."""
    first = [r for r in records if r.get("sample", 0) == 0]
    if not first:
        raise ValueError("no records with sample 0")
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in first:
        by_source[r["data_source"]].append(float(r["reward_components"]["em"]))
    yes_no = [r for r in first if yes_no_question(r["gold"])]
    out: dict[str, float] = {"n": len(first), "em": sum(r["reward_components"]["em"] for r in first) / len(first)}
    for source, ems in sorted(by_source.items()):
        out[f"em_{source}"] = sum(ems) / len(ems)
    out["two_searches"] = sum(len(r["search_calls"]) >= 2 for r in first)
    out["yes_no"] = len(yes_no)
    out["yes_no_answered"] = sum(bool(r["answer"]) and is_judgement(r["answer"]) for r in yes_no)
    out["yes_no_right"] = sum(r["reward_components"]["em"] for r in yes_no)
    read_wrong = [read_wrong_source(r) for r in first if r.get("outcome") == "read_wrong"]
    out["read_wrong"] = len(read_wrong)
    for source in ANSWER_SOURCES:
        out[f"read_wrong_{source}"] = read_wrong.count(source)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", nargs="+", metavar="NAME=EVAL_DIR")
    args = ap.parse_args(argv)
    rows: dict[str, dict[str, float]] = {}
    try:
        for spec in args.evals:
            name, folder = parse_spec(spec)
            rows[name] = breakdown(read_jsonl(run_folder(folder) / "trajectories.jsonl"))
    except (FileNotFoundError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sources = sorted({k[3:] for r in rows.values() for k in r if k.startswith("em_")})
    head = ["eval", "n", "EM", *(f"EM {s}" for s in sources), "searched twice", "yes/no q", "answered yes/no", "right"]
    head += ["read wrong", *(f"from {ANSWER_SOURCE_LABELS[s]}" for s in ANSWER_SOURCES)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, r in rows.items():
        cells = [name, f"{r['n']:.0f}", f"{r['em']:.3f}", *(f"{r.get(f'em_{s}', float('nan')):.3f}" for s in sources)]
        counts = ("two_searches", "yes_no", "yes_no_answered", "yes_no_right", "read_wrong")
        cells += [f"{r[k]:.0f}" for k in (*counts, *(f"read_wrong_{s}" for s in ANSWER_SOURCES))]
        lines.append("| " + " | ".join(cells) + " |")
    summary = " ".join(
        f"{n}:em={r['em']:.3f},yes_no_right={r['yes_no_right']:.0f}/{r['yes_no']:.0f}" for n, r in rows.items()
    )
    sys.stdout.write("\n".join(lines) + f"\nerror_breakdown {summary}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
