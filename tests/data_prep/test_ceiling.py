"""answer_in_topk_fraction with a tiny deterministic retriever, answer matching, and the HTTP adapter against a
mocked transport speaking the retriever's /retrieve contract.

Run: python -m pytest tests/data_prep/test_ceiling.py -q
"""

from __future__ import annotations

import json

import httpx
import pytest

from data_prep.ceiling import (
    RetrieveFn,
    answer_in_corpus_fraction,
    answer_in_topk_fraction,
    has_answer,
    http_retrieve_fn,
)
from data_prep.rows import make_row
from search_rl.reward.qa_em import normalize_answer

PASSAGES = {
    "who wrote hamlet?": ['"Macbeth"\nMacbeth is a play.', '"Hamlet"\nHamlet was written by William Shakespeare.'],
    "when did apollo 11 land?": ['"Apollo 11"\nApollo 11 landed on 20 July 1969.'],
    "what is the capital of peru?": ['"Peru"\nPeru is in South America.', '"Andes"\nThe Andes are mountains.'],
    "who painted the mona lisa?": [],
}
ANSWERS = {
    "who wrote hamlet?": ["Shakespeare", "William Shakespeare"],
    "when did apollo 11 land?": ["July 20, 1969", "20 July 1969"],
    "what is the capital of peru?": ["Lima"],
    "who painted the mona lisa?": ["Leonardo da Vinci"],
}


def _rows() -> list[dict]:
    return [
        make_row(source="nq", split="test", index=i, row_id=f"nq-test-{i}", question=q, answers=ANSWERS[q], prompt=q)
        for i, q in enumerate(ANSWERS)
    ]


def _retrieve(calls: list[list[str]]) -> RetrieveFn:
    def retrieve(questions: list[str]) -> list[list[str]]:
        calls.append(list(questions))
        return [PASSAGES[q] for q in questions]

    return retrieve


def test_fraction_counts_answers_in_top_k() -> None:
    calls: list[list[str]] = []
    assert answer_in_topk_fraction(_rows(), _retrieve(calls), k=3) == 0.5  # hamlet (2nd passage), apollo
    assert answer_in_topk_fraction(_rows(), _retrieve(calls), k=1) == 0.25  # Shakespeare is only 2nd
    assert calls[0] == list(ANSWERS)


def test_questions_are_sent_in_batches() -> None:
    calls: list[list[str]] = []
    answer_in_topk_fraction(_rows(), _retrieve(calls), k=3, batch_size=3)
    assert [len(c) for c in calls] == [3, 1]


def test_answer_matching_is_normalised_and_whole_word() -> None:
    assert normalize_answer("The Beatles!") == "beatles"
    assert has_answer(['"Band"\nThe  BEATLES, a band.'], ["the beatles"])
    assert not has_answer(['"Year"\nIt happened in 1988.'], ["1"])
    assert not has_answer(['"X"\nanything'], ["", "the"])  # answers that normalise to nothing never match


@pytest.mark.parametrize(
    ("rows", "fn", "k", "expected"),
    [
        ([], lambda qs: [], 3, "no rows"),
        (None, lambda qs: [], 0, "k must be >= 1"),
        (None, lambda qs: [[]], 3, "returned 1 result lists for 4 questions"),
        ([{"extra_info": {"id": "a"}}], lambda qs: [], 3, "lacks 'question'"),
    ],
)
def test_errors(rows: list | None, fn: RetrieveFn, k: int, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        answer_in_topk_fraction(_rows() if rows is None else rows, fn, k=k)


@pytest.mark.parametrize("scored", [False, True])
def test_http_retrieve_fn_reads_both_response_shapes(scored: bool) -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        docs = [[{"id": str(i), "contents": p} for i, p in enumerate(PASSAGES[q])] for q in body["queries"]]
        if scored:
            docs = [[{"document": d, "score": 1.0} for d in ds] for ds in docs]
        return httpx.Response(200, json={"result": docs})

    retrieve = http_retrieve_fn("http://retriever.test/retrieve", k=3, transport=httpx.MockTransport(handler))
    assert answer_in_topk_fraction(_rows(), retrieve, k=3) == 0.5
    assert seen[0] == {"queries": list(ANSWERS), "topk": 3, "return_scores": True}  # the rollout client's request


def test_answer_anywhere_in_corpus_bounds_every_top_k() -> None:
    corpus = [p for passages in PASSAGES.values() for p in passages] + ['"Lima"\nLima is the capital of Peru.']
    fraction = answer_in_corpus_fraction(_rows(), corpus)
    assert fraction == 0.75  # all but the Mona Lisa
    assert fraction >= answer_in_topk_fraction(_rows(), _retrieve([]), k=3)
    # A multi-word answer does not match across two passages.
    assert answer_in_corpus_fraction(_rows()[3:], ['"A"\nby Leonardo', '"B"\nda Vinci']) == 0.0
    with pytest.raises(ValueError, match="no rows"):
        answer_in_corpus_fraction([], corpus)
