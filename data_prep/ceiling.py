"""The retrieval ceiling of a test set: the fraction of questions with a gold answer in the top-k passages.

A search policy that issues the question itself as its query cannot beat this figure on exact match unless the
model already knows the answer, so it is the number to read training curves against. Matching uses the QA
exact-match reward's normalisation (``search_rl.reward.qa_em.normalize_answer``: NFKC, lower-case, ASCII and Unicode
punctuation and the articles a/an/the removed, whitespace collapsed) and counts a hit when a normalised answer occurs
in a normalised passage as whole words (so the answer "1" does not match "1988").

Library use: ``answer_in_topk_fraction(rows, retrieve_fn, k=3)``. Against a running retriever service
(``POST /retrieve``, Search-R1's contract)::

    python -m data_prep.ceiling --url http://127.0.0.1:8000/retrieve --topk 3 data/datasets/eval/*.parquet

Without a retriever, ``--corpus data/corpus/wiki_mini.jsonl.gz`` measures the answer anywhere in the corpus instead:
an upper bound of the top-k figure for every retriever and k.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retriever_server.passages import open_text
from retriever_server.settings import DEFAULT_URL
from search_rl.reward.qa_em import normalize_answer

if TYPE_CHECKING:
    import httpx

RetrieveFn = Callable[[list[str]], list[list[str]]]
"""Takes a batch of questions and returns, per question, the passages' text (title and body) best first."""


def has_answer(passages: Sequence[str], answers: Sequence[str]) -> bool:
    """True if some normalised answer occurs as whole words in some normalised passage (empty answers never match).

    >>> has_answer(['"Paris"\\nParis is the capital of France.'], ["paris"])
    True
    """
    targets = [a for a in (normalize_answer(x) for x in answers) if a]
    texts = [f" {normalize_answer(p)} " for p in passages]
    return any(f" {a} " in t for a in targets for t in texts)


def _question_and_answers(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    try:
        return row["question"], list(row["reward_model"]["ground_truth"]["target"])
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"row {row.get('extra_info')} lacks 'question' or reward_model.ground_truth.target; "
            "rows must come from data_prep.qa_to_parquet"
        ) from e


def answer_in_topk_fraction(
    rows: Iterable[Mapping[str, Any]], retrieve_fn: RetrieveFn, k: int = 3, batch_size: int = 64
) -> float:
    """Fraction of rows for which a gold answer appears in the first ``k`` passages retrieved for the question.

    Args:
        rows: Search-R1 rows as written by ``qa_to_parquet`` (``question`` and ``reward_model`` are used).
        retrieve_fn: batch of questions -> per question a list of passage contents, best first.
        k: how many passages count; passages beyond ``k`` are ignored.
        batch_size: questions per call to ``retrieve_fn``.

    Raises:
        ValueError: no rows, ``k < 1``, a row without question/answers, or ``retrieve_fn`` returned a list of
            the wrong length.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    pairs = [_question_and_answers(r) for r in rows]
    if not pairs:
        raise ValueError("no rows to measure")
    hits = 0
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        results = retrieve_fn([q for q, _ in batch])
        if len(results) != len(batch):
            raise ValueError(f"retrieve_fn returned {len(results)} result lists for {len(batch)} questions")
        hits += sum(has_answer(passages[:k], answers) for passages, (_, answers) in zip(results, batch, strict=True))
    return hits / len(pairs)


def answer_in_corpus_fraction(rows: Iterable[Mapping[str, Any]], passages: Iterable[str]) -> float:
    """Fraction of rows with a gold answer anywhere in ``passages`` (the ceiling as k grows to the whole corpus).

    This bounds :func:`answer_in_topk_fraction` from above for any retriever over the same corpus, and needs none.

    Raises:
        ValueError: no rows, or a row without question/answers.
    """
    # One normalised text, passages separated by a newline, which no normalised answer contains.
    text = " " + " \n ".join(normalize_answer(p) for p in passages) + " "
    answers = [_question_and_answers(r)[1] for r in rows]
    if not answers:
        raise ValueError("no rows to measure")
    hits = sum(any(a and f" {a} " in text for a in map(normalize_answer, golds)) for golds in answers)
    return hits / len(answers)


def http_retrieve_fn(
    url: str, k: int, timeout_s: float = 60.0, transport: httpx.AsyncBaseTransport | None = None
) -> RetrieveFn:
    """A ``retrieve_fn`` over the rollout's ``RetrieverClient`` (``POST {url}/retrieve``, with its retries).

    Args:
        url: the retriever's base URL (a trailing ``/retrieve`` is accepted).
        k: passages asked for per question.
        timeout_s: timeout of one HTTP request.
        transport: optional httpx transport (tests).
    """
    from data_prep.retrieval import blocking_search
    from search_rl.config import RetrieverClientConfig
    from search_rl.rollout.backends import RetrieverClient

    client = RetrieverClient(RetrieverClientConfig(url=url, topk=k, timeout_s=timeout_s), transport)
    search = blocking_search(client, k)

    def retrieve(questions: list[str]) -> list[list[str]]:
        return [[f"{p.title}\n{p.text}" for p in passages] for passages in search(questions)]

    return retrieve


def _corpus_contents(path: Path) -> list[str]:
    import json

    with open_text(path) as f:
        return [json.loads(line)["contents"] for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq

    ap = argparse.ArgumentParser(
        prog="python -m data_prep.ceiling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("files", nargs="+", type=Path, help="parquet files written by qa_to_parquet")
    ap.add_argument("--url", default=f"{DEFAULT_URL}/retrieve", help="retriever endpoint")
    ap.add_argument("--topk", type=int, default=3, help="passages that count (default: 3)")
    ap.add_argument(
        "--corpus", type=Path, default=None, help="no retriever: check the answer anywhere in this corpus jsonl(.gz)"
    )
    args = ap.parse_args(argv)
    corpus = _corpus_contents(args.corpus) if args.corpus else None
    retrieve = http_retrieve_fn(args.url, args.topk)
    for path in args.files:
        rows = pq.read_table(path).to_pylist()
        for source in sorted({r["data_source"] for r in rows}):
            subset = [r for r in rows if r["data_source"] == source]
            if corpus is not None:
                fraction, where = answer_in_corpus_fraction(subset, corpus), f"anywhere in {args.corpus}"
            else:
                fraction, where = answer_in_topk_fraction(subset, retrieve, k=args.topk), f"in the top {args.topk}"
            print(f"{path} {source}: {fraction:.3f} of {len(subset)} questions have a gold answer {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
