"""How much of the evidence the policy can see: gold answers in the retrieved passages as shown, by observation budget.

Each question of ``--split`` is sent as its own query (what the trained policy writes, give or take a "when did")
to a running retriever; the top ``--topk`` passages are cut to each ``--budgets`` token budget exactly as the
rollout cuts them (``ObservationBuilder.passages``: the tags whole, passage texts sharing what is left), and a
question counts as covered when a gold answer appears in the shown text (``search_stats.contains_answer``, the
rule behind the ``gold_retrieved`` metric). The last budget column is the untruncated passages.

This is the ceiling on EM that the observation budget sets when the policy searches once with the question: a
model can only read an answer it is shown. Use a train or validation split, so the budget is not chosen on test.

    python bench/observation_budget_bench.py --retriever-url http://127.0.0.1:8000 --split val
    python bench/observation_budget_bench.py --retriever-url http://127.0.0.1:8000 --split train --max-rows 300

Last line: ``observation_budget_bench split=<split> <budget>=<covered share> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from search_rl.config import RetrieverClientConfig
from search_rl.datatypes import Passage
from search_rl.models import load_tokenizer
from search_rl.prompt_data import read_rows
from search_rl.reward.search_stats import contains_answer
from search_rl.rollout.backends import RetrieverClient
from search_rl.rollout.observations import ObservationBuilder

DATA = "data/datasets/nq_hotpotqa_mini/{split}.parquet"
UNCUT = 10**9


async def retrieve(url: str, questions: list[str], topk: int) -> list[list[Passage]]:
    """Top-``topk`` passages for each question, from the retriever at ``url``."""
    client = RetrieverClient(RetrieverClientConfig(url=url, topk=topk))
    try:
        return await client.search(questions, topk=topk)
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retriever-url", required=True)
    ap.add_argument("--split", default="val", choices=("train", "val"), help="never test: see the docstring")
    ap.add_argument("--max-rows", type=int, default=None, help="the first N rows of the split")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--budgets", default="160,256,384,512", help="comma-separated max_obs_tokens values")
    ap.add_argument("--tokenizer", default="smollm2-135m-instruct")
    args = ap.parse_args()

    rows = read_rows([DATA.format(split=args.split)])[: args.max_rows]
    budgets = [int(b) for b in args.budgets.split(",")] + [UNCUT]
    builder = ObservationBuilder(load_tokenizer(args.tokenizer))
    results = asyncio.run(retrieve(args.retriever_url, [r.question for r in rows], args.topk))

    covered: dict[int, Counter[str]] = {b: Counter() for b in budgets}
    total: Counter[str] = Counter()
    for row, passages in zip(rows, results, strict=True):
        total[row.data_source] += 1
        for budget in budgets:
            obs = builder.passages(passages, budget)
            shown = obs.passages if obs is not None else ()
            covered[budget][row.data_source] += any(contains_answer(f"{p.title} {p.text}", row.targets) for p in shown)

    sources = sorted(total)
    names = {b: ("uncut" if b == UNCUT else str(b)) for b in budgets}
    print(f"{len(rows)} questions of {args.split} ({', '.join(f'{s} {total[s]}' for s in sources)}), top-{args.topk}")
    print("| max_obs_tokens | " + " | ".join(sources) + " | all |")
    print("|---|" + "---|" * (len(sources) + 1))
    for b in budgets:
        shares = [covered[b][s] / total[s] for s in sources]
        overall = sum(covered[b].values()) / len(rows)
        print(f"| {names[b]} | " + " | ".join(f"{x:.3f}" for x in shares) + f" | {overall:.3f} |")
    last = " ".join(f"{names[b]}={sum(covered[b].values()) / len(rows):.3f}" for b in budgets)
    print(f"observation_budget_bench split={args.split} {last}")


if __name__ == "__main__":
    main()
