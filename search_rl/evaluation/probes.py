"""Grounding probes: is the policy using the evidence it retrieved, or guessing?

    python -m search_rl.evaluation.probes model.path=runs/sft/global_step_10/actor data.max_samples=50
    python -m search_rl.evaluation.probes --probes empty,random model.path=tiny

The same checkpoint is evaluated (``main_eval``, greedy, same questions and budgets) with the retriever as configured
and then with the retriever replaced by a probe, each a ``Retriever`` wrapping the real one:

- ``empty``: every search returns no passages;
- ``random``: every search returns ``topk`` passages drawn at random from the corpus (seeded per query);
- ``shuffled``: the real results in a random order (does the policy only read the first passage?);
- ``gold_removed``: the real results with the questions' gold passages (``data/datasets/gold_passages.jsonl``)
  taken out and the next passages moved up;
- ``closed_book``: no search at all (``baseline=no_search``).

The report gives, per condition, EM, its drop from the real retriever, searches per question and the share of answers
copied verbatim from an ``<information>`` block. A policy whose EM with random passages is within ``--tolerance`` of
its EM with the real retriever is flagged: its answers do not depend on the evidence. Without the ``random`` probe
(``--probes empty``) grounding is not measured, and the report says only what ran. The last stdout line is
``probes em=<x> empty=<drop> random=<drop> ... grounded=<yes|no|not_measured>``; ``probes.md`` and ``probes.json``
(``"grounded"``: the same three values) go to ``<output_dir>/probes-<time>/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from retriever_server.index.corpus import load_corpus
from retriever_server.passages import split_contents
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.config import ConfigError, EvalConfig
from search_rl.datatypes import Passage
from search_rl.evaluation.fingerprint import describe_retriever
from search_rl.evaluation.run import evaluate, load_eval_config
from search_rl.rollout.backends import RetrieverError, build_retriever
from search_rl.rollout.generation_manager import Retriever

logger = logging.getLogger(__name__)

PROBES = ("empty", "random", "shuffled", "gold_removed", "closed_book")
"""Probe names, in report order."""
Grounded = Literal["yes", "no", "not_measured"]
"""The verdict: EM falls with random passages (``yes``), it does not (``no``), or ``random`` did not run."""
DEFAULT_GOLD = "data/datasets/gold_passages.jsonl"
EXTRA_FOR_GOLD = 10
"""Passages asked for beyond top-k by ``gold_removed``, so that k remain after the gold ones are taken out."""


class Description(dict[str, Any]):
    """A probe's description: a dict, with the ``as_dict()`` of the search backends' fingerprints (run manifests)."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self)


class ProbeRetriever:
    """A probe around a real retriever; ``fingerprint()`` is the real one's plus ``probe``, so a probe's result is
    never mistaken for a real one in ``compare_evals``."""

    name = "none"

    def __init__(self, inner: Retriever, inner_description: dict[str, Any] | None, topk: int) -> None:
        self.inner, self.inner_description, self.topk = inner, inner_description or {}, topk

    def fingerprint(self) -> Description:
        return Description({**self.inner_description, "probe": self.name})

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        raise NotImplementedError


class EmptyRetriever(ProbeRetriever):
    """Every search finds nothing."""

    name = "empty"

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        return [[] for _ in queries]


class RandomPassages(ProbeRetriever):
    """``topk`` passages drawn from the corpus, seeded by the query text (the same query gets the same passages)."""

    name = "random"

    def __init__(self, inner: Retriever, inner_description: dict[str, Any] | None, topk: int, corpus: Path) -> None:
        super().__init__(inner, inner_description, topk)
        c = load_corpus(corpus)
        self.ids, self.contents = c.ids, c.contents

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        k = topk or self.topk
        out = []
        for q in queries:
            picks = random.Random(f"random-probe|{q}").sample(range(len(self.ids)), k)
            out.append([Passage(self.ids[i], *split_contents(self.contents[i])) for i in picks])
        return out


class ShuffledRanks(ProbeRetriever):
    """The real results in an order seeded by the query text."""

    name = "shuffled"

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        rows = await self.inner.search(queries, topk or self.topk)
        shuffled = []
        for q, row in zip(queries, rows, strict=True):
            row = list(row)
            random.Random(f"shuffle-probe|{q}").shuffle(row)
            shuffled.append(row)
        return shuffled


class GoldRemoved(ProbeRetriever):
    """The real results without the gold passages of the evaluated questions (the retriever sees only queries, so
    the union of their gold passage ids is taken out of every result)."""

    name = "gold_removed"

    def __init__(
        self, inner: Retriever, inner_description: dict[str, Any] | None, topk: int, gold_ids: set[str]
    ) -> None:
        super().__init__(inner, inner_description, topk)
        self.gold_ids = gold_ids
        self.removed = 0

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        k = topk or self.topk
        rows = await self.inner.search(queries, k + EXTRA_FOR_GOLD)
        kept = [[p for p in row if p.id not in self.gold_ids] for row in rows]
        self.removed += sum(len(r) - len(kk) for r, kk in zip(rows, kept, strict=True))
        return [row[:k] for row in kept]


def gold_passage_ids(gold_file: Path, data_files: Sequence[str], row_ids: set[str]) -> set[str]:
    """Corpus ids of the gold passages of the rows ``row_ids`` of ``data_files``.

    Raises:
        ValueError: none of the rows has gold passages listed (the probe would remove nothing).
    """
    names = {Path(f).name for f in data_files}
    ids: set[str] = set()
    covered = 0
    with open(gold_file, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if Path(rec["file"]).name in names and rec["id"] in row_ids:
                covered += 1
                ids.update(str(i) for i in rec["corpus_ids"])
    if not covered:
        raise ValueError(
            f"{gold_file} lists no gold passages for the rows of {sorted(names)}: gold_removed needs them "
            "(shipped for nq_hotpotqa_mini and musique); leave it out with --probes"
        )
    return ids


@dataclass(frozen=True)
class Condition:
    """One evaluated condition: its name, EM, searches, copy rate, and the run folder."""

    name: str
    em: float
    searches: float
    copy_rate: float | None
    folder: Path


def build_probe(name: str, cfg: EvalConfig, corpus: Path, gold_file: Path, row_ids: set[str]) -> ProbeRetriever:
    """The probe retriever ``name`` around the configured search backend (not ``closed_book``, which needs none)."""
    inner = build_retriever(cfg.retriever)
    description = describe_retriever(cfg, inner)
    topk = cfg.retriever.topk
    if name == "empty":
        return EmptyRetriever(inner, description, topk)
    if name == "random":
        return RandomPassages(inner, description, topk, corpus)
    if name == "shuffled":
        return ShuffledRanks(inner, description, topk)
    if name == "gold_removed":
        return GoldRemoved(inner, description, topk, gold_passage_ids(gold_file, cfg.data.files, row_ids))
    raise ValueError(f"unknown probe {name!r}; choose from {PROBES}")


def run_probes(
    cfg: EvalConfig, probes: Sequence[str], corpus: Path, gold_file: Path, tolerance: float
) -> tuple[list[Condition], Grounded]:
    """Evaluate the real retriever and every probe; returns the conditions and the verdict (``grounding``)."""
    root = Path(cfg.output_dir) / f"probes-{time.strftime('%Y%m%d-%H%M%S')}"
    conditions = [_condition("retriever", evaluate(replace(cfg, output_dir=str(root / "retriever"))))]
    row_ids = _row_ids(conditions[0].folder)
    for name in probes:
        sub = replace(cfg, output_dir=str(root / name))
        if name == "closed_book":
            result = evaluate(replace(sub, baseline="no_search"))
        else:
            result = evaluate(sub, retriever=build_probe(name, cfg, corpus, gold_file, row_ids))
        conditions.append(_condition(name, result))
    grounded = grounding(conditions, tolerance)
    (root / "probes.md").write_text(report(conditions, grounded) + "\n")
    (root / "probes.json").write_text(
        json.dumps({"grounded": grounded, "conditions": [_as_dict(c) for c in conditions]}, indent=1)
    )
    logger.info("probe report in %s", root)
    return conditions, grounded


def _condition(name: str, result: Any) -> Condition:
    m = result.metrics
    return Condition(
        name, m["eval/all/em"], m["eval/all/searches"], m.get("eval/all/answer_copy_rate"), result.output_dir
    )


def _as_dict(c: Condition) -> dict[str, Any]:
    return {"name": c.name, "em": c.em, "searches": c.searches, "copy_rate": c.copy_rate, "folder": str(c.folder)}


def _row_ids(folder: Path) -> set[str]:
    from search_rl.tracking.jsonl import iter_jsonl

    return {str(rec["uid"]) for _, rec in iter_jsonl(folder / "trajectories.jsonl")}


def grounding(conditions: Sequence[Condition], tolerance: float) -> Grounded:
    """``yes`` when the EM with random passages is more than ``tolerance`` below the real retriever's (the first
    condition), ``no`` when it is not, ``not_measured`` when ``random`` did not run.

    >>> real, rand = Condition("retriever", 0.4, 1.0, None, Path()), Condition("random", 0.1, 1.0, None, Path())
    >>> grounding([real, rand], 0.02), grounding([real, replace(rand, em=0.39)], 0.02), grounding([real], 0.02)
    ('yes', 'no', 'not_measured')
    """
    random_em = next((c.em for c in conditions if c.name == "random"), None)
    if random_em is None:
        return "not_measured"
    return "yes" if random_em < conditions[0].em - tolerance else "no"


def report(conditions: Sequence[Condition], grounded: Grounded) -> str:
    """Markdown: one row per condition with EM, its drop from the real retriever, searches, copy rate; the verdict."""
    base = conditions[0].em
    lines = [
        "| condition | EM | EM drop | searches / question | answers copied from <information> |",
        "|---|---|---|---|---|",
    ]
    for c in conditions:
        copy = "–" if c.copy_rate is None else f"{c.copy_rate:.3f}"
        lines.append(f"| {c.name} | {c.em:.3f} | {base - c.em:+.3f} | {c.searches:.2f} | {copy} |")
    if grounded == "not_measured":
        ran = ", ".join(c.name for c in conditions)
        verdict = f"grounding not measured: the random probe did not run (ran: {ran}); add it with --probes random"
    elif grounded == "yes":
        verdict = "grounded: EM falls when the passages are random"
    elif base <= 0:
        verdict = "FLAGGED: EM is 0 with the real retriever: nothing the evidence could explain"
    else:
        verdict = "FLAGGED: EM with random passages is as high as with the retriever: the answers ignore the evidence"
    return "\n".join([*lines, "", verdict])


def main(argv: list[str] | None = None) -> int:
    from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated, from {','.join(PROBES)}")
    ap.add_argument("--corpus", type=Path, default=SHIPPED_CORPUS, help="corpus of the random probe")
    ap.add_argument("--gold", type=Path, default=Path(DEFAULT_GOLD), help="gold passage ids of gold_removed")
    ap.add_argument("--tolerance", type=float, default=0.02, help="EM gap under which random passages flag")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="main_eval overrides (configs/eval.yaml)")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    try:
        probes = [p for p in args.probes.split(",") if p]
        unknown = [p for p in probes if p not in PROBES]
        if unknown:
            raise ValueError(f"--probes names unknown probes {unknown}; choose from {PROBES}")
        cfg = load_eval_config(args.overrides)
        if cfg.baseline != "search" or cfg.n_samples != 1:
            raise ValueError("probes compare greedy evaluations with search: leave baseline and n_samples unset")
        conditions, grounded = run_probes(cfg, probes, args.corpus, args.gold, args.tolerance)
    except (ConfigError, RetrieverError, FileNotFoundError, ValueError) as e:
        logger.error("cannot run the probes: %s", e)
        return 2
    sys.stdout.write(report(conditions, grounded) + "\n")
    drops = " ".join(f"{c.name}={conditions[0].em - c.em:+.4f}" for c in conditions[1:])
    sys.stdout.write(f"probes em={conditions[0].em:.4f} {drops} grounded={grounded}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
