"""Reward shaping (format reward, partial credit) through ``score_trajectories``: hand-computed scores, a right answer
always beating every wrong one, components untouched, config errors naming the key, and the flat-group metrics.

Run: python -m pytest tests/search_rl/reward/test_shaping.py -q
"""

from __future__ import annotations

import itertools

import pytest
import torch

from search_rl.batches import PromptBatch
from search_rl.config import ConfigError, RewardConfig
from search_rl.configure import load_config
from search_rl.datatypes import RewardResult, Segment, Trajectory, TrajectoryStats
from search_rl.main_eval import load_eval_config
from search_rl.reward import REWARDS, shape_reward
from search_rl.reward.scoring import answer_metrics, reward_metrics, score_trajectories, share_of_flat_groups

GOLD = ("Barack Obama",)


def _traj(*model_texts: str) -> Trajectory:
    """A trajectory of model turns separated by observations; ids are placeholders (rewards read text only)."""
    kinds = [k for text in model_texts for k in (("model", text), ("observation", "<information>d</information>"))]
    kinds = kinds[:-1]
    segs = tuple(Segment(kind, i, i + 1, text) for i, (kind, text) in enumerate(kinds))
    mask = torch.tensor([1 if kind == "model" else 0 for kind, _ in kinds])
    return Trajectory(
        torch.tensor([1]),
        torch.zeros(len(kinds), dtype=torch.long),
        mask,
        None,
        segs,
        None,
        "answer",
        TrajectoryStats(),
    )


# name: (model turns, em, well-formed); f1 / subem against "Barack Obama" in the comments
EPISODES = {
    "right_wf": (("<search> q </search>", "<answer> Barack Obama </answer>"), True, True),
    "right_mal": (("<search> q </search><answer> Barack Obama </answer>",), True, False),  # two actions in a turn
    "close_wf": (("<answer> Obama </answer>",), False, True),  # f1 2/3, subem 0
    "close_mal": (("<think>x<answer> Obama </answer>",), False, False),  # unclosed <think>
    "super_wf": (("<search> q </search>", "<answer> President Barack Obama </answer>"), False, True),  # f1 .8, subem 1
    "super_mal": (("<information>x</information><answer> President Barack Obama </answer>",), False, False),
    "reorder_wf": (("<answer> Obama Barack </answer>",), False, True),  # f1 1, subem 0: full credit, still wrong
    "none": (("<search> q </search>",), False, False),  # never answered
}
NAMES = list(EPISODES)


def _prompts(uids: list[str], targets: tuple[str, ...] = GOLD) -> PromptBatch:
    n = len(uids)
    return PromptBatch(((1,),) * n, tuple(uids), ("nq",) * n, (targets,) * n, ("q",) * n, tuple(range(n)))


def _score(cfg: RewardConfig, names: list[str] = NAMES) -> list[RewardResult]:
    trajs = [_traj(*EPISODES[name][0]) for name in names]
    return score_trajectories(trajs, _prompts([f"u{i}" for i in range(len(names))]), cfg)


def test_episodes_are_what_their_names_say():
    results = _score(RewardConfig())
    for name, r in zip(NAMES, results, strict=True):
        _, right, well_formed = EPISODES[name]
        assert (r.components["em"], r.components["format"]) == (float(right), float(well_formed)), name
    by_name = dict(zip(NAMES, results, strict=True))
    assert by_name["close_wf"].components["f1"] == pytest.approx(2 / 3)
    assert by_name["super_wf"].components["subem"] == 1.0 and by_name["super_wf"].components["f1"] == pytest.approx(0.8)
    assert by_name["reorder_wf"].components["f1"] == 1.0 and by_name["reorder_wf"].components["subem"] == 0.0


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        # right_wf, right_mal, close_wf, close_mal, super_wf, super_mal, reorder_wf, none
        (RewardConfig(), [1, 1, 0, 0, 0, 0, 0, 0]),  # off: exactly EM
        (RewardConfig(format_score=0.2), [1, 0.8, 0.2, 0, 0.2, 0, 0.2, 0]),  # = qa_em_format
        (RewardConfig(partial_credit="f1", partial_credit_weight=0.6), [1, 1, 0.4, 0.4, 0.48, 0.48, 0.6, 0]),
        (
            RewardConfig(format_score=0.2, partial_credit="f1", partial_credit_weight=0.6),
            [1, 0.8, 0.4, 0.4, 0.48, 0.48, 0.6, 0],  # the larger of format and partial; malformed keeps partial
        ),
        (
            RewardConfig(format_score=0.3, partial_credit="subem", partial_credit_weight=0.5),
            [1, 0.7, 0.3, 0, 0.5, 0.5, 0.3, 0],
        ),
    ],
)
def test_hand_computed_scores(cfg, expected):
    assert [r.score for r in _score(cfg)] == pytest.approx(expected)


def test_qa_em_format_is_qa_em_with_format_score():
    trajs = [_traj(*EPISODES[name][0]) for name in NAMES]
    preset = score_trajectories(trajs, _prompts(NAMES), RewardConfig(by_data_source={"nq": "qa_em_format"}))
    shaped = score_trajectories(trajs, _prompts(NAMES), RewardConfig(format_score=0.2))
    assert [r.score for r in preset] == [r.score for r in shaped]
    assert [r.components for r in preset] == [r.components for r in shaped]


FORMAT_SCORES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.499)
WEIGHTS = (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99)


def _valid_settings() -> list[RewardConfig]:
    out = [RewardConfig(format_score=fs) for fs in FORMAT_SCORES]
    for fs, credit, w in itertools.product(FORMAT_SCORES, ("f1", "subem"), WEIGHTS):
        if w < 1 - fs:
            out.append(RewardConfig(format_score=fs, partial_credit=credit, partial_credit_weight=w))
    return out


def test_a_right_answer_always_beats_every_wrong_one():
    settings = _valid_settings()
    assert len(settings) > 60
    for cfg in settings:
        scores = dict(zip(NAMES, [r.score for r in _score(cfg)], strict=True))
        right = [s for n, s in scores.items() if EPISODES[n][1]]
        wrong = [s for n, s in scores.items() if not EPISODES[n][1]]
        assert min(right) > max(wrong), (cfg, scores)
        assert scores["right_wf"] >= scores["right_mal"] and scores["close_wf"] >= scores["close_mal"], cfg


def test_shaping_changes_only_the_score():
    trajs = [_traj(*EPISODES[name][0]) for name in NAMES]
    sources = ["nq"] * len(NAMES)
    plain = _score(RewardConfig())
    shaped = _score(RewardConfig(format_score=0.2, partial_credit="f1", partial_credit_weight=0.5))
    assert [r.components for r in plain] == [r.components for r in shaped]
    before, after = answer_metrics(trajs, plain, sources, "val"), answer_metrics(trajs, shaped, sources, "val")
    assert {k for k in before if before[k] != after[k]} == {"val/nq/score", "val/all/score"}


def test_shaping_needs_the_components_it_reads():
    with pytest.raises(ValueError, match=r"reads the components \['em', 'format', 'f1'\].*only \['em'\]"):
        shape_reward(RewardResult(0.0, {"em": 0.0}), 0.1, "f1", 0.5)
    bare = RewardResult(-1.0, {})
    assert shape_reward(bare) is bare, "shaping off leaves any scoring function alone"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format_score": -0.1}, r"reward\.format_score must be in \[0, 0\.5\)"),
        ({"format_score": 0.5}, r"reward\.format_score must be in \[0, 0\.5\)"),
        ({"format_score": 1.0}, r"reward\.format_score"),
        ({"partial_credit": "bleu", "partial_credit_weight": 0.3}, r"reward\.partial_credit must be null or one of"),
        ({"partial_credit": "f1", "partial_credit_weight": -0.1}, r"reward\.partial_credit_weight must be in"),
        ({"partial_credit": "f1", "partial_credit_weight": 1.0}, r"reward\.partial_credit_weight .* = \[0, 1\), got 1"),
        (
            {"format_score": 0.3, "partial_credit": "subem", "partial_credit_weight": 0.7},
            r"reward\.partial_credit_weight must be in \[0, 1 - reward\.format_score\) = \[0, 0\.7\)",
        ),
        ({"partial_credit_weight": 0.3}, r"reward\.partial_credit=null and reward\.partial_credit_weight=0\.3"),
        ({"partial_credit": "f1"}, r"reward\.partial_credit=f1 and reward\.partial_credit_weight=0\.0"),
        ({"default": "qa_em_format", "format_score": 0.1}, r"reward\.default=qa_em_format is already shaped"),
        (
            {"by_data_source": {"nq": "qa_em_format"}, "partial_credit": "f1", "partial_credit_weight": 0.2},
            r"reward\.by_data_source\.nq=qa_em_format is already shaped",
        ),
    ],
)
def test_config_errors_name_the_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RewardConfig(**kwargs)


def test_config_keys_compose_from_yaml_and_the_command_line():
    cfg = load_config(["reward.format_score=0.2", "reward.partial_credit=subem", "reward.partial_credit_weight=0.3"])
    assert (cfg.reward.format_score, cfg.reward.partial_credit, cfg.reward.partial_credit_weight) == (0.2, "subem", 0.3)
    default = load_config([]).reward
    assert (default.format_score, default.partial_credit, default.partial_credit_weight) == (0.0, None, 0.0)
    assert REWARDS.get(default.default) is REWARDS.get("qa_em")
    with pytest.raises(ValueError, match=r"reward\.format_score"):
        load_config(["reward.format_score=0.7"])
    assert load_eval_config(["reward.format_score=0.1"]).reward.format_score == 0.1
    assert load_eval_config([]).reward.format_score == 0.0


def test_flat_group_metrics_on_a_hand_built_batch():
    names = ["right_wf", "close_wf", "close_wf", "close_mal", "none", "close_mal", "right_wf"]
    uids = ["g1", "g1", "g2", "g2", "g3", "g3", "g4"]
    trajs = [_traj(*EPISODES[name][0]) for name in names]
    shaped = score_trajectories(trajs, _prompts(uids), RewardConfig(format_score=0.2))
    assert [r.score for r in shaped] == pytest.approx([1, 0.2, 0.2, 0, 0, 0, 1])
    m = reward_metrics(shaped, ["nq"] * len(names), uids)
    # g1: (1, .2) vs EM (1, 0); g2: (.2, 0) vs EM (0, 0); g3: (0, 0) both; g4 has one sample and is left out
    assert m["reward/groups_all_equal"] == pytest.approx(1 / 3)
    assert m["reward/groups_all_equal_em"] == pytest.approx(2 / 3)
    assert m["reward/score_mean"] == pytest.approx(2.4 / 7)
    assert m["reward/em"] == pytest.approx(2 / 7) and m["reward/format"] == pytest.approx(4 / 7)

    plain = reward_metrics(score_trajectories(trajs, _prompts(uids), RewardConfig()), ["nq"] * len(names), uids)
    assert plain["reward/groups_all_equal"] == plain["reward/groups_all_equal_em"] == pytest.approx(2 / 3)


def test_flat_group_metrics_are_absent_without_groups():
    results = _score(RewardConfig())  # every sample its own uid: rollout.n = 1 (PPO)
    m = reward_metrics(results, ["nq"] * len(results), [f"u{i}" for i in range(len(results))])
    assert "reward/groups_all_equal" not in m and "reward/groups_all_equal_em" not in m
    assert {"reward/em", "reward/format", "reward/score_mean"} <= set(m)
    assert share_of_flat_groups([], []) is None
    assert share_of_flat_groups([0.5, 0.5, 1.0], ["a", "a", "b"]) == 1.0
