"""QA reward: normalisation, EM / sub-EM / F1 edge cases, answer extraction from model segments only, registry.

Run: python -m pytest tests/search_rl/reward/test_qa_em.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.datatypes import GroundTruth, Segment, Trajectory, TrajectoryStats
from search_rl.reward import (
    REWARDS,
    compute_reward,
    exact_match,
    extract_answer,
    f1_score,
    format_ok,
    normalize_answer,
    reward_fn_for,
    sub_exact_match,
)


def _traj(*segments: tuple[str, str]) -> Trajectory:
    """A trajectory whose segments have the given (kind, text); ids are placeholders (rewards read text only)."""
    segs, pos = [], 0
    for kind, text in segments:
        segs.append(Segment(kind, pos, pos + 1, text))
        pos += 1
    mask = torch.tensor([1 if k == "model" else 0 for k, _ in segments])
    return Trajectory(
        torch.tensor([1]),
        torch.zeros(pos, dtype=torch.long),
        mask,
        None,
        tuple(segs),
        None,
        "answer",
        TrajectoryStats(),
    )


@pytest.mark.parametrize(
    ("pred", "gold", "em"),
    [
        ("The Beatles", "Beatles", 1.0),  # articles
        ("an apple", "apple", 1.0),
        ("Theatre", "atre", 0.0),  # articles only as whole words
        ("U.S.", "US", 1.0),  # punctuation deleted (SQuAD)
        ("Paris!!!", "paris", 1.0),
        ("  New   York ", "new york", 1.0),  # whitespace
        ("São Paulo", "são paulo", 1.0),  # unicode case folding, accents kept
        ("Sao Paulo", "São Paulo", 0.0),
        ("“Hamlet”", '"Hamlet"', 1.0),  # curly quotes are punctuation too
        ("ＩＢＭ", "IBM", 1.0),  # full-width forms (NFKC)
        ("1,000", "1000", 1.0),
        ("Paris", "Lyon", 0.0),
    ],
)
def test_exact_match_edge_cases(pred, gold, em):
    assert exact_match(pred, [gold]) == em


def test_multiple_gold_answers_and_no_answer():
    golds = ["Barack Obama", "Obama", "Barack Hussein Obama II"]
    assert exact_match("obama", golds) == 1.0
    assert exact_match("Michelle Obama", golds) == 0.0
    assert sub_exact_match("President Barack Obama", golds) == 1.0
    assert f1_score("Michelle Obama", golds) == pytest.approx(2 / 3)
    for fn in (exact_match, sub_exact_match, f1_score):
        assert fn(None, golds) == 0.0
    assert exact_match("", [""]) == 1.0 and sub_exact_match("anything", [""]) == 0.0, (
        "empty gold never substring-matches"
    )


def test_f1_values():
    assert f1_score("the cat sat", ["cat sat on mat"]) == pytest.approx(2 * (2 / 2) * (2 / 4) / (1 + 0.5))
    assert f1_score("dog", ["cat"]) == 0.0
    assert normalize_answer("The  Cat, the HAT.") == "cat hat"


def test_answer_is_last_answer_of_model_segments_only():
    traj = _traj(
        ("model", "<search> q </search>"),
        ("observation", "<information>Doc 1(Title: X) <answer> Lyon </answer></information>"),
        ("model", "<answer> Nice </answer> oh wait <answer> Paris </answer>"),
    )
    assert extract_answer(traj.model_texts) == "Paris"
    assert compute_reward(traj, GroundTruth(("Paris",), "nq")).score == 1.0
    only_in_obs = _traj(("model", "<search> q </search>"), ("observation", "<answer> Paris </answer>"), ("model", "hm"))
    result = compute_reward(only_in_obs, GroundTruth(("Paris",), "nq"))
    assert result.score == 0.0 and result.components["answered"] == 0.0


def test_tags_split_by_an_observation_do_not_pair():
    assert extract_answer(["<answer> Par", "is </answer>"]) is None


def test_format_check():
    good = ["<think>a</think><search> q </search>", "<think>b</think><answer> A </answer>"]
    assert format_ok(good)
    assert not format_ok(["<search> q </search>"])  # never answered
    assert not format_ok(["<answer> A </answer>", "<answer> B </answer>"])  # answered before the end
    assert not format_ok(["<search> q </search><answer> A </answer>"])  # two actions in one turn
    assert not format_ok(["<think>unclosed<answer> A </answer>"])
    assert not format_ok(["<information>made up</information><answer> A </answer>"])
    assert not format_ok([])


def test_registry_default_and_overrides():
    assert reward_fn_for("nq") is REWARDS.get("qa_em")
    assert reward_fn_for("some_new_source") is REWARDS.get("qa_em"), "unknown sources fall back to the default"
    assert reward_fn_for("nq", {"nq": "qa_f1"}) is REWARDS.get("qa_f1")
    assert reward_fn_for("x", {"x": "search_rl.reward.scorers:qa_subem"}) is REWARDS.get("qa_subem")
    with pytest.raises(KeyError, match="registered: qa_em, qa_em_format, qa_f1, qa_subem"):
        reward_fn_for("nq", {"nq": "nope"})


@pytest.mark.parametrize(
    ("texts", "gold", "score"),
    [
        (["<search> q </search>", "<answer> Paris </answer>"], "Paris", 1.0),
        (["<search> q </search><answer> Paris </answer>"], "Paris", 0.8),
        (["<search> q </search>", "<answer> Lyon </answer>"], "Paris", 0.2),
        (["Paris"], "Paris", 0.0),
    ],
)
def test_em_format_reward(texts, gold, score):
    traj = _traj(*[("model", t) for t in texts])
    result = REWARDS.get("qa_em_format")(traj, GroundTruth((gold,)))
    assert result.score == pytest.approx(score)
    assert set(result.components) == {"em", "subem", "f1", "format", "answered"}
