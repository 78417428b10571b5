"""Synthesise supervised warm-start trajectories (search, then answer) from training rows and a real retriever.

The default policy never follows the search protocol by itself, so it is first fine-tuned on these. In every
trajectory the model's turns search for the question (or a rewrite of it), the passages after each search are what
the retriever actually returned for that query, and the final turn answers with a gold answer that the retrieved
text supports. Usage::

    python -m data_prep.synth_sft --url http://127.0.0.1:8000/retrieve \\
        --input data/datasets/nq_hotpotqa_mini/train.parquet \\
        --output data/datasets/nq_hotpotqa_mini/sft_train.parquet [--topk 3] [--seed 0] [--max-rows N] \\
        [--max-searches 2] [--no-think-fraction 0.2]

Output: the input rows that got a supported answer, every input column unchanged, plus ``trajectory`` (turns
``{"text", "passages": [{"id", "title", "text"}]}``; passages empty on the final turn) and ``sft`` (``variant``,
``num_searches``, ``answer``, ``support_passage``). Counts go to stdout and to ``<output stem>.manifest.json``.

Support: a gold answer is supported when its normalised form (``normalize_answer``) occurs as whole words in the
normalised title + text of a passage retrieved in that trajectory; the first supported gold in target order is
used. ``yes``/``no`` golds never count (a passage containing the word "no" does not say the answer is no).

Searches: the first query is the question without its ``?`` or a rule-based rewrite (leading wh-word/auxiliary
dropped, lower-cased). If its passages support no gold, the next search is chosen among honest follow-ups: the other
query form, or an entity named in a retrieved passage (alone or with the rewrite), the multi-hop step; the first
follow-up (in a fixed, seeded order) whose passages support a gold is taken. No query contains a gold that may be
the answer: a gold the question itself contains is never used (it would be "found" by any search for the question),
and a row left without golds is dropped (``answer_in_question``; ``yes_no_answer`` when all golds are yes/no). Rows
still unsupported after ``--max-searches`` searches are dropped (``no_supported_answer``); every drop is counted.

Query forms, the support rule, thought templates and the per-row invariant check live in :mod:`data_prep.sft_surface`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.retrieval import SearchFn, blocking_search
from data_prep.sft_surface import (
    UNSUPPORTABLE,
    Search,
    Support,
    check_turns,
    contains_phrase,
    find_support,
    has_gold,
    passage_entities,
    question_query,
    render_turns,
    rewrite_query,
)
from retriever_server.settings import DEFAULT_URL
from search_rl.reward.qa_em import normalize_answer
from search_rl.sft.rows import read_input, write_output

NO_THINK_FRACTION = 0.2
DROP_NO_SUPPORT, DROP_IN_QUESTION, DROP_YES_NO = "no_supported_answer", "answer_in_question", "yes_no_answer"


@dataclass
class _Row:
    """Per-row synthesis state; the random choices are drawn up front so they do not depend on retrieval."""

    row: dict[str, Any]
    row_id: str
    golds: list[str]
    rng: random.Random
    think: bool
    first: Search | None
    entity_first: bool
    searches: list[Search] = field(default_factory=list)
    support: Support | None = None
    dropped: str | None = None


def _start(row: dict[str, Any], seed: int, no_think_fraction: float) -> _Row:
    row_id, question = row["extra_info"]["id"], row["question"]
    targets = [g for g in row["reward_model"]["ground_truth"]["target"] if normalize_answer(g)]
    # A gold the question already contains would be in every query and trivially "found": never use it.
    golds = [g for g in targets if normalize_answer(g) not in UNSUPPORTABLE and not contains_phrase(question, g)]
    rng = random.Random(f"{seed}:{row_id}")
    think, use_rewrite, entity_first = rng.random() >= no_think_fraction, rng.random() < 0.5, rng.random() < 0.5
    forms = [Search("question", question_query(question)), Search("rewrite", rewrite_query(question))]
    forms = [f for f in (forms[::-1] if use_rewrite else forms) if not has_gold(f.query, golds)]
    state = _Row(row, row_id, golds, rng, think, forms[0] if forms else None, entity_first)
    if all(normalize_answer(g) in UNSUPPORTABLE for g in targets):
        state.dropped = DROP_YES_NO
    elif not golds or not forms:
        state.dropped = DROP_IN_QUESTION
    return state


def _follow_ups(state: _Row) -> list[Search]:
    """Next-search candidates after a search whose passages supported no gold, best first, none with a gold."""
    if not state.searches:
        return [state.first] if state.first else []
    last, rewrite = state.searches[-1], rewrite_query(state.row["question"])
    other = [Search("rephrase", q) for q in (question_query(state.row["question"]), rewrite)]
    found = []
    for name, doc in passage_entities(state.row["question"], last.passages):
        pair = [Search("entity", name, name, doc), Search("entity_rewrite", f"{name} {rewrite}", name, doc)]
        found += pair if state.entity_first else pair[::-1]
    done = {normalize_answer(s.query) for s in state.searches}
    out: dict[str, Search] = {}
    for c in other + found:
        key = normalize_answer(c.query)
        if key and key not in done and key not in out and not has_gold(c.query, state.golds):
            out[key] = c
    return list(out.values())


def _search_round(states: list[_Row], search_fn: SearchFn) -> None:
    """One search for every unsupported row: the first candidate whose passages support a gold, else the first."""
    asks = [(s, c) for s in states for c in _follow_ups(s)]
    results = search_fn([c.query for _, c in asks]) if asks else []
    if len(results) != len(asks):
        raise ValueError(f"the retriever returned {len(results)} result lists for {len(asks)} queries")
    tried: dict[int, list[Search]] = {}
    for (s, c), hits in zip(asks, results, strict=True):
        tried.setdefault(id(s), []).append(Search(c.kind, c.query, c.entity, c.doc, tuple(hits)))
    for s in states:
        options = tried.get(id(s), [])
        chosen = next((o for o in options if find_support(o.passages, s.golds)), options[0] if options else None)
        if chosen is not None:
            s.searches.append(chosen)
            s.support = find_support(chosen.passages, s.golds)


def _variant(state: _Row) -> str:
    """E.g. ``question/think`` or ``rewrite>entity/bare``: the query kinds in order, and whether it thinks."""
    return ">".join(s.kind for s in state.searches) + ("/think" if state.think else "/bare")


@dataclass
class Report:
    """What a synthesis read, kept and dropped."""

    read: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    variants: Counter[str] = field(default_factory=Counter)
    searches: Counter[int] = field(default_factory=Counter)


def synthesise(
    rows: Sequence[dict[str, Any]],
    search_fn: SearchFn,
    *,
    seed: int = 0,
    max_searches: int = 2,
    no_think_fraction: float = NO_THINK_FRACTION,
) -> tuple[list[dict[str, Any]], Report]:
    """Kept rows (input columns + ``trajectory`` + ``sft``), in input order, and the counts.

    ``no_think_fraction`` of the rows (by a per-row draw) write no ``<think>`` turns; the draw comes first, so rows
    synthesised at any fraction have the same searches and answers and differ only in their thoughts.

    Raises:
        ValueError: ``max_searches < 1``, ``no_think_fraction`` outside [0, 1], or the retriever answered a batch
            with the wrong number of lists.
        AssertionError: a synthesised row breaks an invariant (a bug; the message names the row).
    """
    if max_searches < 1:
        raise ValueError(f"max_searches must be >= 1, got {max_searches}")
    if not 0.0 <= no_think_fraction <= 1.0:
        raise ValueError(f"no_think_fraction must be in [0, 1], got {no_think_fraction}")
    states = [_start(r, seed, no_think_fraction) for r in rows]
    for _ in range(max_searches):
        _search_round([s for s in states if s.dropped is None and s.support is None], search_fn)
    out, report = [], Report()
    for s in states:
        source = s.row["data_source"]
        report.read[source] += 1
        if s.support is None:
            report.dropped[s.dropped or DROP_NO_SUPPORT] += 1
            continue
        turns = render_turns(s.searches, s.support, s.think, s.rng)
        check_turns(
            s.row_id, turns, s.searches, s.support, s.row["reward_model"]["ground_truth"]["target"], max_searches
        )
        variant = _variant(s)
        sft = {"variant": variant, "num_searches": len(s.searches), "answer": s.support.answer}
        out.append({**s.row, "trajectory": turns, "sft": {**sft, "support_passage": s.support.passage.id}})
        report.kept[source] += 1
        report.variants[variant] += 1
        report.searches[len(s.searches)] += 1
    return out, report


def http_search_fn(url: str, topk: int) -> tuple[SearchFn, dict[str, Any]]:
    """A ``SearchFn`` over the shared ``RetrieverClient`` (batches of 64), and each URL's ``/health`` summary."""
    import httpx

    from search_rl.config import RetrieverClientConfig
    from search_rl.rollout.backends import RetrieverClient, RetrieverError

    client = RetrieverClient(RetrieverClientConfig(url=url, topk=topk, max_queries_per_request=64, max_concurrency=4))
    client.check_reachable()
    health = {}
    for base in client.urls:
        try:
            info = httpx.get(f"{base}/health", timeout=10.0, trust_env=False).json()
        except (httpx.HTTPError, ValueError) as e:
            raise RetrieverError(f"GET {base}/health failed: {e}", base) from e
        health[base] = {k: info.get(k) for k in ("method", "num_documents", "encoder_model")}
    return blocking_search(client, topk), health


def _shown(path: Path) -> str:
    root = Path(__file__).resolve().parents[1]
    resolved = path.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def build_manifest(args: argparse.Namespace, argv: Sequence[str], report: Report, health: dict[str, Any]) -> dict:
    """Everything needed to judge and reproduce the output file."""
    return {
        "description": "search-rl SFT warm-start trajectories; see docs/data.md (Warm-start trajectories)",
        "command": "python -m data_prep.synth_sft " + shlex.join(argv),
        "input": {"file": _shown(args.input), "sha256": hashlib.sha256(args.input.read_bytes()).hexdigest()},
        "output": {"file": _shown(args.output), "sha256": hashlib.sha256(args.output.read_bytes()).hexdigest()},
        "retriever": {"url": args.url, "health": health},
        "topk": args.topk,
        "seed": args.seed,
        "max_searches": args.max_searches,
        "no_think_fraction": args.no_think_fraction,
        "max_rows": args.max_rows,
        "rows_read": sum(report.read.values()),
        "rows_kept": sum(report.kept.values()),
        "rows_dropped": sum(report.dropped.values()),
        "dropped_by_reason": dict(sorted(report.dropped.items())),
        "per_source": {s: {"read": n, "kept": report.kept[s]} for s, n in sorted(report.read.items())},
        "per_variant": dict(sorted(report.variants.items())),
        "per_num_searches": {str(k): v for k, v in sorted(report.searches.items())},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.synth_sft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", default=f"{DEFAULT_URL}/retrieve", help="retriever URL (base or .../retrieve)")
    ap.add_argument("--input", required=True, type=Path, help="question rows (parquet from qa_to_parquet)")
    ap.add_argument("--output", required=True, type=Path, help="output parquet; the manifest goes next to it")
    ap.add_argument("--topk", type=int, default=3, help="passages per search (default: 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the surface variants (default: 0)")
    ap.add_argument("--max-rows", type=int, default=None, help="read only the first N rows")
    ap.add_argument("--max-searches", type=int, default=2, help="most searches per trajectory (default: 2)")
    ap.add_argument(
        "--no-think-fraction",
        type=float,
        default=NO_THINK_FRACTION,
        help=f"share of rows without <think> turns, 1.0 = none think (default: {NO_THINK_FRACTION})",
    )
    args = ap.parse_args(argv)
    if args.topk < 1 or args.max_searches < 1 or (args.max_rows is not None and args.max_rows < 1):
        ap.error("--topk, --max-searches and --max-rows must be >= 1")
    if not 0.0 <= args.no_think_fraction <= 1.0:
        ap.error(f"--no-think-fraction must be in [0, 1], got {args.no_think_fraction}")
    from search_rl.rollout.backends import RetrieverError

    try:
        schema, rows = read_input(args.input, args.max_rows)
        search_fn, health = http_search_fn(args.url, args.topk)
        out, report = synthesise(
            rows, search_fn, seed=args.seed, max_searches=args.max_searches, no_think_fraction=args.no_think_fraction
        )
    except (ValueError, RetrieverError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_output(out, schema, args.output)
    manifest = build_manifest(args, argv, report, health)
    manifest_path = args.output.with_name(args.output.stem + ".manifest.json")
    manifest_path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for source, counts in manifest["per_source"].items():
        print(f"{source}: kept {counts['kept']}/{counts['read']}")
    print(f"read {manifest['rows_read']}, kept {manifest['rows_kept']}, dropped {manifest['dropped_by_reason']}")
    print(f"searches {manifest['per_num_searches']}; variants {manifest['per_variant']}")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes) and {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
