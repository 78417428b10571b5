"""Compare evaluations of several models on the same questions: ``python -m search_rl.tools.compare_evals
NAME=DIR [NAME=DIR ...]``.

Each ``DIR`` is a ``main_eval`` output: a run folder holding ``metrics.json`` and ``trajectories.jsonl``, or a folder of
such runs (the newest is read). Prints a markdown table (EM, F1, answer rate, searches per question, gold answer in a
retrieved passage) and, for each row after the first, a paired comparison with the row before it: the questions it
gets right that the other gets wrong and the reverse, and the exact two-sided McNemar p-value of that split (is the EM
difference more than noise on these questions?). Rows must cover the same questions; a mismatch is an error naming
the folders and the count of questions each has alone.

Rows must also have been made the same way: their fingerprints (``metrics.json``'s ``fingerprint``, written by
``main_eval``: retriever, corpus, index and search settings, top-k, engine, dtype and the engine's batching settings,
template, budgets, the rollout's schedule and batch size, data files, packages) must agree except in the model, or
the command refuses and names every difference. ``--allow retriever.topk`` (a dotted key or a section such as
``retriever``) says a difference is intended; intended differences are printed under the table. A row that cannot
be checked is refused as well: one without a fingerprint (made before fingerprints existed: ``--allow fingerprint``
compares it unchecked) and one whose retriever gave nothing to pin it on (``--allow retriever.unpinned``). A key an
older result does not record (``<absent>``, such as ``rollout.schedule``) differs from any value: its run's value is
unknown, so it is refused until named (``--allow rollout``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search_rl.evaluation.comparisons import check_comparable
from search_rl.tracking.jsonl import iter_jsonl

COLUMNS = (
    ("EM", "eval/all/em"),
    ("F1", "eval/all/f1"),
    ("answer rate", "eval/all/answer_rate"),
    ("searches / question", "eval/all/searches"),
    ("gold retrieved", "eval/all/gold_retrieved"),
)
"""Table columns: header and the ``metrics.json`` key (``main_eval``'s, over all data sources)."""


@dataclass(frozen=True)
class EvalRun:
    """One evaluated model: its name in the table, its folder, its metrics and its EM per question id."""

    name: str
    folder: Path
    metrics: dict[str, float]
    em: dict[str, float]
    fingerprint: dict[str, Any] | None = None
    """What produced the evaluation (``search_rl.evaluation.fingerprint``); None for evaluations made before."""


@dataclass(frozen=True)
class Paired:
    """``other`` against ``base`` on the same questions: ``better`` (other right, base wrong), ``worse``, and the
    exact two-sided McNemar p-value of that split."""

    base: str
    other: str
    better: int
    worse: int
    p: float


def run_folder(folder: Path) -> Path:
    """``folder`` when it holds an evaluation, else its newest sub-folder that does.

    Raises:
        FileNotFoundError: when neither holds ``metrics.json`` and ``trajectories.jsonl``.
    """
    if (folder / "metrics.json").is_file():
        return folder
    runs = sorted(p.parent for p in folder.glob("*/metrics.json") if (p.parent / "trajectories.jsonl").is_file())
    if not runs:
        raise FileNotFoundError(f"{folder}: no main_eval output (metrics.json + trajectories.jsonl) here or below")
    return runs[-1]


def load_eval(name: str, folder: Path) -> EvalRun:
    """Read one evaluation: metrics and the greedy EM of every question (``uid``), from its first sample.

    Raises:
        FileNotFoundError: no evaluation in ``folder``.
        ValueError: a trajectory line without ``uid`` or ``reward_components.em``, named by file and line; a sampled
            evaluation (``n_samples > 1``), whose first sample is not the greedy answer.
    """
    run = run_folder(folder)
    metrics = json.loads((run / "metrics.json").read_text())
    fingerprint = metrics.pop("fingerprint", None)
    if int(metrics.get("n_samples", 1)) > 1:
        raise ValueError(
            f"{run}: a sampled evaluation (n_samples={metrics['n_samples']}); the paired test compares greedy "
            "evaluations: run main_eval with n_samples=1"
        )
    em: dict[str, float] = {}
    path = run / "trajectories.jsonl"
    for line_no, record in iter_jsonl(path):
        try:
            uid, score = str(record["uid"]), float(record["reward_components"]["em"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}:{line_no}: trajectory without uid or reward_components.em ({e})") from e
        em.setdefault(uid, score)  # several samples per question: the first (greedy evaluation has one)
    return EvalRun(name, run, metrics, em, fingerprint)


def mcnemar_p(better: int, worse: int) -> float:
    """Exact two-sided McNemar p-value of ``better`` vs ``worse`` discordant pairs (1.0 when there are none)."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(base: EvalRun, other: EvalRun) -> Paired:
    """Paired EM comparison of two runs on the same questions.

    Raises:
        ValueError: the runs do not cover the same questions (naming both folders and the counts each has alone).
    """
    if base.em.keys() != other.em.keys():
        only_base, only_other = len(base.em.keys() - other.em.keys()), len(other.em.keys() - base.em.keys())
        raise ValueError(
            f"{base.folder} and {other.folder} evaluate different questions ({only_base} only in the first, "
            f"{only_other} only in the second): evaluate both with the same data.max_samples and seed"
        )
    better = sum(1 for k, v in base.em.items() if other.em[k] > v)
    worse = sum(1 for k, v in base.em.items() if other.em[k] < v)
    return Paired(base.name, other.name, better, worse, mcnemar_p(better, worse))


def table(runs: list[EvalRun]) -> str:
    """The markdown table, one row per run, in the given order."""
    header = "| model | " + " | ".join(h for h, _ in COLUMNS) + " |"
    lines = [header, "|---|" + "---|" * len(COLUMNS)]
    for r in runs:
        cells = [f"{r.metrics[k]:.3f}" if k in r.metrics else "–" for _, k in COLUMNS]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(p: Paired) -> str:
    """One line: ``rl vs sft: better on 6, worse on 1 questions; exact McNemar p = 0.125``."""
    return f"{p.other} vs {p.base}: better on {p.better}, worse on {p.worse} questions; exact McNemar p = {p.p:.3f}"


def report(runs: list[EvalRun], allow: tuple[str, ...] = ()) -> str:
    """Table, question count, the paired comparison of each row with the one before it, and the intended
    differences of the runs' fingerprints.

    Raises:
        ValueError: fingerprints differ in a key ``allow`` does not name, or a row has none or an unpinned section
            (``evaluation.comparisons``).
    """
    intended = check_comparable([r.name for r in runs], [r.fingerprint for r in runs], allow)
    n = len(runs[0].em)
    comparisons = [describe(paired(a, b)) for a, b in zip(runs, runs[1:], strict=False)]
    lines = [table(runs), "", f"{n} questions, greedy; paired EM:", *(f"- {c}" for c in comparisons)]
    if intended:
        lines += ["", "Differences in how the rows were made (intended):", *(f"- {d}" for d in intended)]
    return "\n".join(lines)


def parse_spec(spec: str) -> tuple[str, Path]:
    """``NAME=DIR`` → (name, folder).

    Raises:
        ValueError: without ``=`` or with an empty name.
    """
    name, sep, folder = spec.partition("=")
    if not sep or not name:
        raise ValueError(f"{spec!r}: expected NAME=DIR, e.g. sft=runs/eval/sft")
    return name, Path(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="NAME=DIR", help="evaluations to compare, in table order")
    ap.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="KEY",
        help="an intended fingerprint difference: a dotted key (retriever.topk) or a section (retriever); or a gap "
        "to accept: fingerprint (rows without one), retriever.unpinned; repeatable",
    )
    args = ap.parse_args(argv)
    try:
        runs = [load_eval(*parse_spec(s)) for s in args.runs]
        sys.stdout.write(report(runs, tuple(args.allow)) + "\n")
    except (ValueError, FileNotFoundError) as e:
        sys.stderr.write(f"compare_evals: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
