"""What ``open`` can add to search: gold answers shown by a search alone, and by a search followed by ``open``.

Each question of ``--split`` is sent as its own query to a running retriever (what the trained policy writes, give or
take a "when did"); its top ``--topk`` passages are cut to ``--budget`` tokens as the rollout cuts them
(``ObservationBuilder.passages``). Then the article of a hit is fetched as the ``open`` tool fetches it (``POST
/documents``, ``--max-chars``) and cut to the same budget, as its own observation. A question counts as covered when
a gold answer appears in the shown text (``search_stats.contains_answer``, the rule behind ``gold_retrieved``).

Columns: ``search`` (the passages alone); ``+ open hit 1`` (a policy that always opens the first hit); ``+ open
best`` (one that opens the hit whose article shows the answer, if any: the most one ``open`` call can add). It
measures the evidence the tool can put in front of the model, not what a model does with it: a policy must be
trained to call ``open`` (Search-R1's warm start never does, since its prompt does not offer it).

    python bench/open_tool_bench.py --retriever-url http://127.0.0.1:8000 --split val

Last line: ``open_tool_bench split=<split> search=<share> open_first=<share> open_best=<share>``.
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


async def search_and_open(
    url: str, questions: list[str], topk: int, max_chars: int
) -> tuple[list[list[Passage]], dict[str, Passage | None]]:
    """Top-``topk`` passages of each question, and the article of every hit (by id)."""
    client = RetrieverClient(RetrieverClientConfig(url=url, topk=topk))
    try:
        hits = await client.search(questions, topk=topk)
        ids = sorted({p.id for passages in hits for p in passages})
        articles: dict[str, Passage | None] = {}
        for start in range(0, len(ids), 64):  # the route's most ids per request
            chunk = ids[start : start + 64]
            articles.update(zip(chunk, await client.documents(chunk, max_chars), strict=True))
        return hits, articles
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retriever-url", required=True)
    ap.add_argument("--split", default="val", choices=("train", "val"), help="never test: settings are chosen on it")
    ap.add_argument("--max-rows", type=int, default=None, help="the first N rows of the split")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--budget", type=int, default=384, help="max_obs_tokens of each observation")
    ap.add_argument("--max-chars", type=int, default=4000, help="the open tool's settings.max_chars")
    ap.add_argument("--tokenizer", default="smollm2-135m-instruct")
    args = ap.parse_args()

    rows = read_rows([DATA.format(split=args.split)])[: args.max_rows]
    builder = ObservationBuilder(load_tokenizer(args.tokenizer))
    hits, articles = asyncio.run(
        search_and_open(args.retriever_url, [r.question for r in rows], args.topk, args.max_chars)
    )

    def shows(passages: list[Passage], golds) -> bool:
        obs = builder.passages(passages, args.budget)
        return obs is not None and any(contains_answer(f"{p.title} {p.text}", golds) for p in obs.passages)

    total, covered = Counter[str](), {c: Counter[str]() for c in ("search", "open_first", "open_best")}
    missing = 0
    for row, passages in zip(rows, hits, strict=True):
        total[row.data_source] += 1
        by_search = shows(passages, row.targets)
        opened = [articles[p.id] for p in passages]
        missing += sum(a is None for a in opened)
        by_article = [a is not None and shows([a], row.targets) for a in opened]
        covered["search"][row.data_source] += by_search
        covered["open_first"][row.data_source] += by_search or (bool(by_article) and by_article[0])
        covered["open_best"][row.data_source] += by_search or any(by_article)
    if missing:
        print(f"{missing} hits had no article (an id the corpus lacks): counted as not shown")

    sources = sorted(total)
    names = {"search": "search", "open_first": "+ open hit 1", "open_best": "+ open best"}
    print(
        f"{len(rows)} questions of {args.split} ({', '.join(f'{s} {total[s]}' for s in sources)}), top-{args.topk}, "
        f"{args.budget} tokens per observation, articles cut to {args.max_chars} characters"
    )
    print("| shown | " + " | ".join(sources) + " | all |")
    print("|---|" + "---|" * (len(sources) + 1))
    for c, name in names.items():
        shares = [covered[c][s] / total[s] for s in sources]
        print(
            f"| {name} | " + " | ".join(f"{x:.3f}" for x in shares) + f" | {sum(covered[c].values()) / len(rows):.3f} |"
        )
    last = " ".join(f"{c}={sum(covered[c].values()) / len(rows):.3f}" for c in names)
    print(f"open_tool_bench split={args.split} {last}")


if __name__ == "__main__":
    main()
