"""SFT warm-start trajectories from real training rows and a real BM25 retriever server (the shipped corpus).

Run: python -m pytest tests/data_prep/test_synth_sft.py -q
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.rows import read_rows, write_rows
from data_prep.sft_surface import (
    Search,
    Support,
    check_turns,
    contains_phrase,
    find_support,
    question_query,
    render_turns,
    rewrite_query,
)
from data_prep.synth_sft import http_search_fn, main, read_input, synthesise
from search_rl.config import RetrieverClientConfig
from search_rl.datatypes import Passage
from search_rl.reward.format import format_ok
from search_rl.rollout.actions import parse_action
from search_rl.rollout.backends import RetrieverClient

TRAIN = Path(__file__).resolve().parents[2] / "data" / "datasets" / "nq_hotpotqa_mini" / "train.parquet"
UNKNOWABLE_ID = "nq-train-unknowable"
MAX_ROWS = 20


@pytest.fixture(scope="module")
def input_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unanswerable row, then real NQ rows and HotpotQA rows (some of which need a second, multi-hop search)."""
    rows = read_rows(TRAIN)
    unknowable = json.loads(json.dumps(rows[0]))
    unknowable["extra_info"]["id"] = UNKNOWABLE_ID
    unknowable["reward_model"]["ground_truth"]["target"] = ["zzqxv unknowable"]
    path = tmp_path_factory.mktemp("synth") / "train.parquet"
    write_rows([unknowable, *rows[:6], *rows[2040:2056]], path)  # 23 rows; --max-rows keeps the first 20
    return path


def _run(url: str, input_file: Path, out: Path, *extra: str) -> dict[str, Any]:
    args = ["--url", f"{url}/retrieve", "--input", str(input_file), "--output", str(out), "--max-rows", str(MAX_ROWS)]
    assert main([*args, *extra]) == 0
    return json.loads(out.with_name(out.stem + ".manifest.json").read_text())


@pytest.fixture(scope="module")
def synthesised(retriever_url: str, input_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth-out") / "sft.parquet"
    return out, _run(retriever_url, input_file, out)


def test_rewrite_and_support_rules() -> None:
    assert question_query("Who wrote  Hamlet?") == "Who wrote Hamlet"
    assert rewrite_query("Who is the author of Hamlet?") == "the author of hamlet"
    assert rewrite_query("Which?") == "which"  # nothing left after the wh-word: keep the question
    assert not contains_phrase("A Parisian cafe", "Paris") and contains_phrase("The city of Paris.", "paris")
    passages = [Passage("1", "Lyon", "A Parisian cafe."), Passage("2", "France", "Its capital is Paris.")]
    support = find_support(passages, ["no", "Paris"])
    assert support is not None and (support.answer, support.passage.id, support.doc) == ("Paris", "2", 2)
    assert find_support([Passage("3", "X", "There is no answer.")], ["no"]) is None  # yes/no never count


def test_a_broken_trajectory_fails_loudly_naming_the_row() -> None:
    paris = Passage("2", "France", "Its capital is Paris.")
    searches = [Search("question", "capital of France", passages=(paris,))]
    support = Support("Paris", paris, 1)
    turns = render_turns(searches, support, think=True, rng=random.Random(0))
    check_turns("nq-train-x", turns, searches, support, ["Paris"], max_searches=2)
    leaky = [Search("question", "is Paris the capital of France", passages=(paris,))]
    with pytest.raises(AssertionError, match="row nq-train-x: .*the query holds the answer"):
        check_turns("nq-train-x", render_turns(leaky, support, True, random.Random(0)), leaky, support, ["Paris"], 2)
    with pytest.raises(AssertionError, match="row nq-train-y: answer turn parses"):
        check_turns("nq-train-y", turns, searches, support, ["Lyon"], max_searches=2)


def test_missing_column_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"data_source": ["nq"], "extra_info": [{"id": "x"}]}), bad)
    with pytest.raises(ValueError, match=r"bad\.parquet has no column 'question'"):
        read_input(bad)
    assert main(["--input", str(bad), "--output", str(tmp_path / "out.parquet")]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "'question'" in err
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.integration
def test_kept_rows_follow_the_protocol_and_answer_from_their_passages(synthesised: tuple[Path, dict]) -> None:
    out, _ = synthesised
    rows = pq.read_table(out).to_pylist()
    assert rows and any(r["sft"]["num_searches"] == 2 for r in rows)
    assert len({r["sft"]["variant"] for r in rows}) >= 3
    for row in rows:
        turns, sft = row["trajectory"], row["sft"]
        texts = [t["text"] for t in turns]
        assert format_ok(texts), row["extra_info"]["id"]
        assert len(turns) - 1 == sft["num_searches"] <= 2 and turns[-1]["passages"] == []
        for turn in turns[:-1]:
            action = parse_action(turn["text"])
            assert action.kind == "search" and 1 <= len(turn["passages"]) <= 3
            assert not contains_phrase(action.content, sft["answer"])  # the answer never leaks into a query
        answer = parse_action(texts[-1])
        assert answer.kind == "answer" and answer.content == sft["answer"]
        assert sft["answer"] in row["reward_model"]["ground_truth"]["target"]
        passages = [p for t in turns for p in t["passages"]]
        assert any(p["id"] == sft["support_passage"] for p in passages)
        assert any(contains_phrase(f"{p['title']} {p['text']}", sft["answer"]) for p in passages)


@pytest.mark.integration
def test_input_columns_are_copied_unchanged(synthesised: tuple[Path, dict], input_file: Path) -> None:
    out, _ = synthesised
    inputs = {r["extra_info"]["id"]: r for r in read_rows(input_file)}
    for row in pq.read_table(out).to_pylist():
        assert {k: v for k, v in row.items() if k not in ("trajectory", "sft")} == inputs[row["extra_info"]["id"]]


@pytest.mark.integration
def test_passages_are_what_the_retriever_returns(synthesised: tuple[Path, dict], retriever_url: str) -> None:
    out, _ = synthesised
    turns = [t for r in pq.read_table(out).to_pylist() for t in r["trajectory"][:-1]]
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url))
    again = asyncio.run(client.search([parse_action(t["text"]).content for t in turns], 3))
    for turn, hits in zip(turns, again, strict=True):
        assert turn["passages"] == [{"id": p.id, "title": p.title, "text": p.text} for p in hits]


@pytest.mark.integration
def test_counts_add_up_and_the_unknowable_row_is_dropped(synthesised: tuple[Path, dict], input_file: Path) -> None:
    out, manifest = synthesised
    rows = pq.read_table(out).to_pylist()
    assert manifest["rows_read"] == MAX_ROWS == manifest["rows_kept"] + manifest["rows_dropped"]
    assert manifest["rows_kept"] == len(rows) == sum(manifest["per_variant"].values())
    assert sum(manifest["per_num_searches"].values()) == len(rows)
    assert sum(manifest["dropped_by_reason"].values()) == manifest["rows_dropped"]
    assert manifest["dropped_by_reason"]["no_supported_answer"] >= 1
    assert UNKNOWABLE_ID not in {r["extra_info"]["id"] for r in rows}
    assert sum(s["read"] for s in manifest["per_source"].values()) == MAX_ROWS
    assert sum(s["kept"] for s in manifest["per_source"].values()) == len(rows)
    assert manifest["retriever"]["health"] and all(
        h["method"] == "bm25" for h in manifest["retriever"]["health"].values()
    )
    assert manifest["input"]["sha256"] == hashlib.sha256(input_file.read_bytes()).hexdigest()
    assert (manifest["topk"], manifest["seed"], manifest["max_searches"]) == (3, 0, 2)


@pytest.mark.integration
def test_output_is_deterministic(
    synthesised: tuple[Path, dict], retriever_url: str, input_file: Path, tmp_path: Path
) -> None:
    out, manifest = synthesised
    again = _run(retriever_url, input_file, tmp_path / "sft.parquet")
    assert pq.read_table(tmp_path / "sft.parquet").to_pylist() == pq.read_table(out).to_pylist()
    assert again["output"]["sha256"] == manifest["output"]["sha256"]


@pytest.mark.integration
def test_max_searches_bounds_the_searches(retriever_url: str, input_file: Path) -> None:
    _, rows = read_input(input_file, MAX_ROWS)
    search_fn, _ = http_search_fn(retriever_url, 3)
    one, report = synthesise(rows, search_fn, max_searches=1)
    two, _ = synthesise(rows, search_fn, max_searches=2)
    assert one and all(r["sft"]["num_searches"] == 1 for r in one) and len(one) < len(two)
    assert set(report.searches) == {1}


@pytest.mark.integration
def test_no_think_fraction_changes_only_the_thoughts(
    synthesised: tuple[Path, dict], retriever_url: str, input_file: Path, tmp_path: Path
) -> None:
    """At 1.0 no row thinks and every row has the default run's searches, passages and answer, thoughts stripped;
    at 0.0 every model turn opens with a thought."""
    out, _ = synthesised
    default = pq.read_table(out).to_pylist()
    assert {r["sft"]["variant"].endswith("/think") for r in default} == {True, False}  # the default mixes both
    bare_manifest = _run(retriever_url, input_file, tmp_path / "bare.parquet", "--no-think-fraction", "1.0")
    bare = pq.read_table(tmp_path / "bare.parquet").to_pylist()
    assert bare_manifest["no_think_fraction"] == 1.0
    assert [r["extra_info"]["id"] for r in bare] == [r["extra_info"]["id"] for r in default]
    for d, b in zip(default, bare, strict=True):
        stripped = [t["text"].split("</think>\n")[-1] for t in d["trajectory"]]
        assert [t["text"] for t in b["trajectory"]] == stripped
        assert [t["passages"] for t in b["trajectory"]] == [t["passages"] for t in d["trajectory"]]
        assert b["sft"]["variant"].endswith("/bare")
    _run(retriever_url, input_file, tmp_path / "think.parquet", "--no-think-fraction", "0")
    think = pq.read_table(tmp_path / "think.parquet").to_pylist()
    assert all(t["text"].startswith("<think>") for r in think for t in r["trajectory"])


def test_a_no_think_fraction_outside_0_1_is_refused(input_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--input", str(input_file), "--output", str(tmp_path / "x.parquet"), "--no-think-fraction", "1.5"])
    with pytest.raises(ValueError, match="no_think_fraction must be in"):
        synthesise([], lambda queries: [], no_think_fraction=-0.1)
