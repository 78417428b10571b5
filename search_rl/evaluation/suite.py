"""The standard suite: Search-R1's seven QA datasets, one command, Search-R1's table.

    python -m search_rl.evaluation.suite model.path=runs/sft/global_step_10/actor data.max_samples=100
    python -m search_rl.evaluation.suite --datasets nq,hotpotqa,bamboogle model.path=tiny

Each dataset file is evaluated by ``main_eval`` (greedy, with search, the same overrides for every file:
``data.max_samples`` caps each file), and the rows are grouped by ``data_source``. The first table is Search-R1's
layout, EM per dataset (general QA: NQ, TriviaQA, PopQA; multi-hop: HotpotQA, 2Wiki, MuSiQue, Bamboogle) and the
average over the datasets evaluated; the second gives F1, searches per question and tokens per question (model
tokens / whole response). A dataset whose file is not there is listed as missing with how to make it, never skipped
silently: TriviaQA and PopQA cannot be shipped with provenance yet (docs/evaluation.md). ``suite.md`` and
``suite.json`` (with each file's fingerprint) go to ``<output_dir>/suite-<time>/``; the last stdout line is
``suite avg_em=<x> datasets=<k>/7 missing=<names>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from search_rl.config import ConfigError, EvalConfig
from search_rl.evaluation.run import evaluate, load_eval_config
from search_rl.prompt_data import resolve_data_path
from search_rl.rollout.backends import RetrieverError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuiteDataset:
    """One dataset of the suite: its column header, its rows' ``data_source``, its file, how to make a missing one."""

    name: str
    header: str
    source: str
    file: str
    how_to_add: str = ""


_MAKE = "python -m data_prep.qa_to_parquet --format {fmt} --input {name}=<{what}> --split test --out {file}"
SUITE = (
    SuiteDataset("nq", "NQ", "nq", "data/datasets/nq_hotpotqa_mini/test.parquet"),
    SuiteDataset(
        "triviaqa",
        "TriviaQA",
        "triviaqa",
        "data/datasets/eval/triviaqa_test.parquet",
        _MAKE.format(
            fmt="triviaqa",
            what="TriviaQA unfiltered-web-dev.json",
            name="triviaqa",
            file="data/datasets/eval/triviaqa_test.parquet",
        ),
    ),
    SuiteDataset(
        "popqa",
        "PopQA",
        "popqa",
        "data/datasets/eval/popqa_test.parquet",
        _MAKE.format(fmt="popqa", what="PopQA popQA.tsv", name="popqa", file="data/datasets/eval/popqa_test.parquet"),
    ),
    SuiteDataset("hotpotqa", "HotpotQA", "hotpotqa", "data/datasets/nq_hotpotqa_mini/test.parquet"),
    SuiteDataset("2wiki", "2wiki", "2wikimultihopqa", "data/datasets/eval/2wikimultihopqa_test.parquet"),
    SuiteDataset("musique", "Musique", "musique", "data/datasets/eval/musique_test.parquet"),
    SuiteDataset("bamboogle", "Bamboogle", "bamboogle", "data/datasets/eval/bamboogle_test.parquet"),
)
"""The seven datasets in Search-R1's column order."""
NAMES = tuple(d.name for d in SUITE)


@dataclass(frozen=True)
class SuiteRow:
    """One dataset's results (None for a missing one)."""

    dataset: SuiteDataset
    metrics: dict[str, float] | None


def present(d: SuiteDataset) -> Path | None:
    """The dataset's file, if it exists."""
    try:
        return resolve_data_path(d.file)
    except FileNotFoundError:
        return None


def run_suite(cfg: EvalConfig, names: Sequence[str]) -> tuple[list[SuiteRow], Path]:
    """Evaluate every present file of the chosen datasets once; returns one row per dataset and the suite folder."""
    chosen = [d for d in SUITE if d.name in names]
    root = Path(cfg.output_dir) / f"suite-{time.strftime('%Y%m%d-%H%M%S')}"
    by_file: dict[str, dict[str, float]] = {}
    fingerprints: dict[str, object] = {}
    for d in chosen:
        if present(d) is None or d.file in by_file:
            continue
        sub = replace(cfg, output_dir=str(root / Path(d.file).stem), data=replace(cfg.data, files=[d.file]))
        result = evaluate(sub)
        by_file[d.file] = result.metrics
        fingerprints[d.file] = json.loads((result.output_dir / "metrics.json").read_text())["fingerprint"]
    rows = []
    for d in chosen:
        m = by_file.get(d.file)
        rows.append(SuiteRow(d, _source_metrics(m, d.source) if m is not None else None))
    root.mkdir(parents=True, exist_ok=True)
    (root / "suite.md").write_text(tables(rows) + "\n")
    (root / "suite.json").write_text(
        json.dumps({"rows": {r.dataset.name: r.metrics for r in rows}, "fingerprints": fingerprints}, indent=1)
    )
    return rows, root


def _source_metrics(metrics: dict[str, float], source: str) -> dict[str, float] | None:
    prefix = f"eval/{source}/"
    found = {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
    return found or None


def average_em(rows: Sequence[SuiteRow]) -> float | None:
    """Mean EM over the datasets evaluated (each dataset weighs the same, as in Search-R1's table).

    >>> d = SUITE[0]
    >>> average_em([SuiteRow(d, {"em": 0.5}), SuiteRow(d, {"em": 0.25}), SuiteRow(d, None)])
    0.375
    """
    ems = [r.metrics["em"] for r in rows if r.metrics is not None]
    return sum(ems) / len(ems) if ems else None


def tables(rows: Sequence[SuiteRow]) -> str:
    """Search-R1's EM table (datasets, then the average), the per-dataset details, and the missing datasets."""

    def cell(r: SuiteRow, key: str, fmt: str) -> str:
        return "–" if r.metrics is None or key not in r.metrics else format(r.metrics[key], fmt)

    avg = average_em(rows)
    em = [
        "| | " + " | ".join(r.dataset.header for r in rows) + " | Avg. |",
        "|---|" + "---|" * (len(rows) + 1),
        "| EM | " + " | ".join(cell(r, "em", ".3f") for r in rows) + f" | {'–' if avg is None else f'{avg:.3f}'} |",
    ]
    details = [
        "| dataset | n | EM | F1 | searches / question | model tokens / question | response tokens / question |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        details.append(
            f"| {r.dataset.header} | {cell(r, 'n', '.0f')} | {cell(r, 'em', '.3f')} | {cell(r, 'f1', '.3f')} | "
            f"{cell(r, 'searches', '.2f')} | {cell(r, 'model_tokens', '.1f')} | {cell(r, 'response_tokens', '.1f')} |"
        )
    missing = [r.dataset for r in rows if r.metrics is None]
    notes = [
        f"- missing {d.name}: no {d.file}" + (f"; make it with `{d.how_to_add}`" if d.how_to_add else "")
        for d in missing
    ]
    n = len(rows) - len(missing)
    return "\n".join([*em, "", f"Avg. is over the {n} datasets evaluated.", "", *details, "", *notes]).rstrip()


def main(argv: list[str] | None = None) -> int:
    from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(NAMES), help=f"comma-separated, from {','.join(NAMES)}")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="main_eval overrides (configs/eval.yaml)")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    try:
        names = [n for n in args.datasets.split(",") if n]
        unknown = [n for n in names if n not in NAMES]
        if unknown:
            raise ValueError(f"--datasets names unknown datasets {unknown}; choose from {NAMES}")
        cfg = load_eval_config(args.overrides)
        rows, root = run_suite(cfg, names)
    except (ConfigError, RetrieverError, FileNotFoundError, ValueError) as e:
        logger.error("cannot run the suite: %s", e)
        return 2
    text = tables(rows)
    sys.stdout.write(text + "\n")
    logger.info("suite report in %s", root)
    avg = average_em(rows)
    missing = ",".join(r.dataset.name for r in rows if r.metrics is None) or "none"
    evaluated = sum(r.metrics is not None for r in rows)
    avg_text = "nan" if avg is None else f"{avg:.4f}"
    sys.stdout.write(f"suite avg_em={avg_text} datasets={evaluated}/{len(rows)} missing={missing}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
