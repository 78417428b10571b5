"""``scoring.pass_at_k_metrics``: pass@k per data source from each question's samples.

Run: python -m pytest tests/search_rl/reward/test_scoring.py -q
"""

from __future__ import annotations

import pytest

from search_rl.datatypes import RewardResult
from search_rl.reward.scoring import pass_at_k_metrics


def results(ems: list[float]) -> list[RewardResult]:
    return [RewardResult(score=e, components={"em": e, "f1": 0.5}) for e in ems]


def test_pass_at_k_counts_questions_with_any_exact_answer():
    # q1 right once of 3, q2 never (a partial 0.5 is not exact), q3 right every time; q4 (hotpotqa) never
    uids = ["q1", "q1", "q1", "q2", "q2", "q2", "q3", "q3", "q3", "q4", "q4", "q4"]
    sources = ["nq"] * 9 + ["hotpotqa"] * 3
    ems = [0, 1, 0, 0.5, 0, 0, 1, 1, 1, 0, 0, 0]
    metrics = pass_at_k_metrics(uids, results(ems), sources, "eval")
    assert metrics == {
        "eval/all/pass@3": pytest.approx(2 / 4),
        "eval/all/questions": 4.0,
        "eval/hotpotqa/pass@3": 0.0,
        "eval/hotpotqa/questions": 1.0,
        "eval/nq/pass@3": pytest.approx(2 / 3),
        "eval/nq/questions": 3.0,
    }


def test_uneven_samples_and_mixed_sources_are_errors():
    with pytest.raises(ValueError, match=r"same number of samples per question, got \[1, 2\]"):
        pass_at_k_metrics(["a", "a", "b"], results([1, 0, 0]), ["nq"] * 3, "eval")
    with pytest.raises(ValueError, match=r"question a is under two data sources \(nq, hotpotqa\)"):
        pass_at_k_metrics(["a", "a"], results([1, 0]), ["nq", "hotpotqa"], "eval")
