"""``main_eval``: greedy evaluation with search and the two baselines, per-source metrics, dumps, the result line.

Run: python -m pytest tests/search_rl/test_main_eval.py -q
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from search_rl.evaluation.run import evaluate, load_eval_config
from search_rl.tracking.jsonl import read_jsonl

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RESULT_LINE = re.compile(r"^eval n=(\d+) em=([\d.]+) subem=([\d.]+) f1=([\d.]+)$")
SMALL = [
    "model=tiny",
    "data.max_samples=3",
    "max_turns=1",
    "actor_rollout_ref.rollout.max_turn_tokens=16",
    "batch_size=2",
]
SEARCH_KEYS = (
    "search_attempts",
    "valid_search_rate",
    "duplicate_query_rate",
    "gold_retrieved",
    "no_answer",
    "wrong_no_search",
    "retrieval_missed",
    "read_wrong",
    "read_wrong_gold_passage",
    "read_wrong_other_passage",
    "read_wrong_not_shown",
    "answer_words_mean",
    "n_searches_0",
    "n_searches_1",
    "n_searches_2",
    "n_searches_3plus",
    "n_yes_no",
)
"""Search diagnostics every evaluation reports (``em_searches_<b>`` only for non-empty buckets)."""


@pytest.mark.parametrize("baseline", ["search", "no_search", "naive_rag"])
def test_evaluate_each_baseline(baseline, retriever_url, tmp_path):
    cfg = load_eval_config([*SMALL, f"baseline={baseline}", f"retriever.url={retriever_url}", f"output_dir={tmp_path}"])
    result = evaluate(cfg)
    match = RESULT_LINE.match(result.summary)
    assert match and match.group(1) == "3"
    assert {"eval/all/em", "eval/all/subem", "eval/all/f1", "eval/all/answer_rate", "eval/all/searches"} <= set(
        result.metrics
    )
    assert any(k.startswith("eval/nq/") or k.startswith("eval/hotpotqa/") for k in result.metrics)
    records = read_jsonl(result.output_dir / "trajectories.jsonl")
    assert len(records) == 3 and all(r["kind"] == "eval" and r["gold"] for r in records)
    prompt = records[0]["prompt"]
    assert ("Passages:\nDoc 1(Title:" in prompt) == (baseline == "naive_rag")
    assert ("own knowledge" in prompt) == (baseline != "search")  # the baselines' templates
    saved = json.loads((result.output_dir / "metrics.json").read_text())
    assert saved["baseline"] == baseline
    # the search diagnostics are in metrics.json and agree with the per-trajectory records
    assert {f"eval/all/{k}" for k in SEARCH_KEYS} <= set(saved)
    for outcome in ("no_answer", "wrong_no_search", "retrieval_missed", "read_wrong"):
        assert saved[f"eval/all/{outcome}"] == pytest.approx(sum(r["outcome"] == outcome for r in records) / 3)
    assert saved["eval/all/gold_retrieved"] == pytest.approx(sum(r["gold_retrieved"] for r in records) / 3)
    for source in ("gold_passage", "other_passage", "not_shown"):
        share = sum(r["answer_source"] == source for r in records) / 3
        assert saved[f"eval/all/read_wrong_{source}"] == pytest.approx(share)
    assert all((r["answer_source"] is None) == (r["outcome"] != "read_wrong") for r in records)
    assert sum(saved[f"eval/all/n_searches_{b}"] for b in ("0", "1", "2", "3plus")) == 3
    assert all(len(r["search_calls"]) == r["stats"]["searches"] for r in records)
    if baseline != "search":
        assert saved["eval/all/n_searches_0"] == 3 and not any(r["search_calls"] for r in records)


def test_sampled_evaluation_reports_mean_em_and_pass_at_k(retriever_url, tmp_path):
    overrides = [*SMALL, f"retriever.url={retriever_url}", f"output_dir={tmp_path}", "n_samples=3"]
    result = evaluate(load_eval_config(overrides))
    match = re.match(r"^eval n=3 em=([\d.]+) subem=[\d.]+ f1=[\d.]+ samples=3 pass@3=([\d.]+)$", result.summary)
    assert match, result.summary
    records = read_jsonl(result.output_dir / "trajectories.jsonl")
    assert len(records) == 9
    by_question: dict[str, list[dict]] = {}
    for r in records:
        by_question.setdefault(r["uid"], []).append(r)
    assert len(by_question) == 3 and all(sorted(r["sample"] for r in rs) == [0, 1, 2] for rs in by_question.values())
    # samples, not three copies of one greedy answer: the random tiny model's sampled responses differ
    assert any(len({r["response"] for r in rs}) > 1 for rs in by_question.values())
    saved = json.loads((result.output_dir / "metrics.json").read_text())
    assert saved["n_samples"] == 3 and saved["eval/all/n"] == 9 and saved["eval/all/questions"] == 3
    ems = [r["reward_components"]["em"] for r in records]
    # the summary prints 4 decimals: within half a unit of the last of them
    assert saved["eval/all/em"] == pytest.approx(sum(ems) / 9) == pytest.approx(float(match.group(1)), abs=5e-5)
    solved = [max(r["reward_components"]["em"] for r in rs) for rs in by_question.values()]
    assert saved["eval/all/pass@3"] == pytest.approx(sum(solved) / 3)
    # the same seed gives the same samples
    again = evaluate(load_eval_config(overrides))
    again_records = read_jsonl(again.output_dir / "trajectories.jsonl")
    assert [r["response"] for r in again_records] == [r["response"] for r in records]


def test_sampling_needs_a_positive_temperature():
    with pytest.raises(Exception, match="n_samples=2 samples at actor_rollout_ref.rollout.temperature"):
        load_eval_config(["n_samples=2", "actor_rollout_ref.rollout.temperature=0"])
    with pytest.raises(Exception, match="n_samples must be >= 1"):
        load_eval_config(["n_samples=0"])


def test_cli_prints_the_result_line_last(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "search_rl.main_eval", *SMALL, "baseline=no_search", f"output_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert RESULT_LINE.match(proc.stdout.strip().splitlines()[-1])
