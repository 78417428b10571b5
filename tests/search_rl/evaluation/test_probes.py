"""Grounding probes: each probe retriever changes what the policy sees as documented, and the probe command runs the
same checkpoint under every condition against a real retriever server; the suite reports missing datasets.

Run: python -m pytest tests/search_rl/evaluation/test_probes.py -q
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from search_rl.datatypes import Passage
from search_rl.evaluation import probes, suite
from search_rl.evaluation.probes import (
    EmptyRetriever,
    GoldRemoved,
    RandomPassages,
    ShuffledRanks,
    gold_passage_ids,
)
from search_rl.main_eval import load_eval_config

CORPUS = Path("tests/data_prep/fixtures/corpus.jsonl.gz")
TINY = [
    "model=tiny",
    "data.max_samples=3",
    "max_turns=1",
    "actor_rollout_ref.rollout.max_turn_tokens=16",
    "batch_size=3",
]


class ListRetriever:
    """The same ranked passages for every query."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = list(ids)
        self.asked: list[int | None] = []

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        self.asked.append(topk)
        return [[Passage(i, f"T{i}", f"text {i}") for i in self.ids[:topk]] for _ in queries]


def ids(rows: list[list[Passage]]) -> list[list[str]]:
    return [[p.id for p in row] for row in rows]


def test_probe_retrievers_change_what_is_shown():
    inner = ListRetriever([str(i) for i in range(20)])
    desc = {"method": "bm25", "index_path": "bm25-abc"}
    assert asyncio.run(EmptyRetriever(inner, desc, 3).search(["a", "b"])) == [[], []]
    shuffled = ids(asyncio.run(ShuffledRanks(inner, desc, 5).search(["a", "b"])))
    assert all(sorted(r, key=int) == ["0", "1", "2", "3", "4"] for r in shuffled) and shuffled[0] != shuffled[1]
    assert shuffled == ids(asyncio.run(ShuffledRanks(inner, desc, 5).search(["a", "b"])))  # seeded by the query
    gold = GoldRemoved(inner, desc, 3, gold_ids={"0", "2"})
    assert ids(asyncio.run(gold.search(["a"]))) == [["1", "3", "4"]] and gold.removed == 2
    assert inner.asked[-1] == 3 + probes.EXTRA_FOR_GOLD
    rand = RandomPassages(inner, desc, 3, CORPUS)
    drawn = ids(asyncio.run(rand.search(["q1", "q2"])))
    assert all(len(r) == 3 and set(r) <= set(rand.ids) for r in drawn) and drawn[0] != drawn[1]
    assert EmptyRetriever(inner, desc, 3).fingerprint() == {**desc, "probe": "empty"}


def test_gold_ids_of_the_shipped_questions():
    gold = Path(probes.DEFAULT_GOLD)
    first = json.loads(gold.read_text().splitlines()[0])
    found = gold_passage_ids(gold, [f"data/datasets/{first['file']}"], {first["id"]})
    assert found == set(first["corpus_ids"])
    with pytest.raises(ValueError, match="lists no gold passages.*bamboogle_test.parquet"):
        gold_passage_ids(gold, ["data/datasets/eval/bamboogle_test.parquet"], {"bamboogle-test-x"})


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_probes_run_every_condition(retriever_url, tmp_path, capsys):
    rc = probes.main(["--tolerance", "0.02", f"retriever.url={retriever_url}", f"output_dir={tmp_path}", *TINY])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("probes em=") and "grounded=no" in out[-1]  # a random model does not use evidence
    (root,) = tmp_path.glob("probes-*")
    report = json.loads((root / "probes.json").read_text())
    names = [c["name"] for c in report["conditions"]]
    assert names == ["retriever", *probes.PROBES]
    assert all(c["em"] == 0.0 for c in report["conditions"])  # the random model does not move
    fps = {
        n: json.loads((Path(c["folder"]) / "metrics.json").read_text())["fingerprint"]
        for n, c in zip(names, report["conditions"], strict=True)
    }
    assert fps["retriever"]["retriever"]["method"] == "bm25" and "probe" not in fps["retriever"]["retriever"]
    assert fps["random"]["retriever"]["probe"] == "random"
    assert fps["closed_book"]["template"]["baseline"] == "no_search"


def test_grounding_is_yes_no_or_not_measured():
    real = probes.Condition("retriever", 0.4, 1.0, None, Path("r"))
    empty = probes.Condition("empty", 0.1, 1.0, None, Path("e"))
    random_as_good = probes.Condition("random", 0.39, 1.0, None, Path("x"))
    assert probes.grounding([real, empty], 0.02) == "not_measured"
    assert probes.grounding([real, empty, random_as_good], 0.02) == "no"
    assert probes.grounding([real, random_as_good], 0.0) == "yes"
    text = probes.report([real, empty], "not_measured")
    assert "grounding not measured: the random probe did not run (ran: retriever, empty)" in text
    assert "grounded:" not in text and "FLAGGED" not in text


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_without_the_random_probe_grounding_is_not_measured(retriever_url, tmp_path, capsys):
    args = ["--probes", "empty", f"retriever.url={retriever_url}", f"output_dir={tmp_path}", *TINY]
    assert probes.main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("probes em=") and out[-1].endswith("grounded=not_measured")
    (root,) = tmp_path.glob("probes-*")
    assert json.loads((root / "probes.json").read_text())["grounded"] == "not_measured"
    assert "grounding not measured" in (root / "probes.md").read_text()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_suite_table_and_missing_datasets(retriever_url, tmp_path, capsys):
    args = ["--datasets", "nq,triviaqa,popqa,bamboogle", f"retriever.url={retriever_url}", f"output_dir={tmp_path}"]
    assert suite.main([*args, *TINY]) == 0
    out = capsys.readouterr().out
    assert "| | NQ | TriviaQA | PopQA | Bamboogle | Avg. |" in out
    assert "missing triviaqa: no data/datasets/eval/triviaqa_test.parquet; make it with" in out
    assert "missing popqa" in out
    assert out.strip().splitlines()[-1] == "suite avg_em=0.0000 datasets=2/4 missing=triviaqa,popqa"


def test_suite_layout_is_search_r1s():
    assert [d.header for d in suite.SUITE] == ["NQ", "TriviaQA", "PopQA", "HotpotQA", "2wiki", "Musique", "Bamboogle"]
    assert load_eval_config([]).baseline == "search"
