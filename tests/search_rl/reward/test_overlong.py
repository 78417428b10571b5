"""DAPO's overlong penalty: hand-computed values, the length it measures (the whole response, observations included),
its place after the format/partial-credit shaping in ``score_trajectories``, and errors naming the keys.

Run: python -m pytest tests/search_rl/reward/test_overlong.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.batches import PromptBatch
from search_rl.config import ConfigError, RewardConfig
from search_rl.configure import load_config
from search_rl.datatypes import RewardResult, Segment, Trajectory, TrajectoryStats
from search_rl.reward import apply_overlong_penalty, overlong_penalty
from search_rl.reward.scoring import score_trajectories

BUDGET, BUFFER = 100, 20  # the penalty starts after 80 tokens and reaches the factor at 100


@pytest.mark.parametrize(
    ("length", "factor", "expected"),
    [
        (10, 1.0, 0.0),
        (80, 1.0, 0.0),  # exactly L_max - b: not yet
        (81, 1.0, -0.05),  # 1 of 20 buffer tokens
        (85, 1.0, -0.25),
        (90, 1.0, -0.5),
        (100, 1.0, -1.0),  # at the budget: the whole factor
        (90, 0.5, -0.25),
        (120, 1.0, -1.0),  # past the budget (cannot happen in the loop): capped at the factor
    ],
)
def test_overlong_penalty_hand_computed(length, factor, expected):
    assert overlong_penalty(length, BUDGET, BUFFER, factor) == pytest.approx(expected)


def test_buffer_zero_is_off_and_a_buffer_as_large_as_the_budget_is_refused():
    assert overlong_penalty(10**6, BUDGET, 0, 1.0) == 0.0
    base = RewardResult(1.0, {"em": 1.0})
    assert apply_overlong_penalty(base, 10**6, BUDGET, 0, 1.0) is base
    with pytest.raises(ValueError, match="reward.overlong_buffer_tokens=100 must be below actor_rollout_ref.rollout"):
        overlong_penalty(50, BUDGET, 100, 1.0)


def _traj(model_tokens: int, obs_tokens: int, answer: str) -> Trajectory:
    """A search then an answer: model turn, observation, model turn; ``model_tokens`` split over the two turns."""
    first = model_tokens // 2
    segs = (
        Segment("model", 0, first, "<search> q </search>"),
        Segment("observation", first, first + obs_tokens, "<information>d</information>"),
        Segment("model", first + obs_tokens, model_tokens + obs_tokens, f"<answer> {answer} </answer>"),
    )
    mask = torch.tensor([1] * first + [0] * obs_tokens + [1] * (model_tokens - first))
    return Trajectory(
        torch.tensor([1]), torch.zeros(len(mask), dtype=torch.long), mask, None, segs, "x", "answer", TrajectoryStats()
    )


def _prompts(n: int) -> PromptBatch:
    return PromptBatch(
        ((1,),) * n, tuple(f"u{i}" for i in range(n)), ("nq",) * n, (("Paris",),) * n, ("q",) * n, (0,) * n
    )


def test_the_whole_response_counts_observations_included():
    # 10 model tokens + 80 observation tokens = 90 of 100: penalised as 90 (-0.5); the same model tokens with a
    # 20-token observation (30 in all) are not penalised.
    trajs = [_traj(10, 80, "Paris"), _traj(10, 20, "Paris")]
    results = score_trajectories(trajs, _prompts(2), RewardConfig(overlong_buffer_tokens=BUFFER), BUDGET)
    assert [r.score for r in results] == pytest.approx([0.5, 1.0])
    assert [r.components["overlong_penalty"] for r in results] == pytest.approx([-0.5, 0.0])
    assert [r.components["em"] for r in results] == [1.0, 1.0]  # the answer components are untouched


def test_penalty_comes_after_the_format_shaping():
    # A wrong, well-formed answer earns format_score 0.2, then loses 0.25 at 85 tokens: -0.05. A right one at 95
    # tokens: 1 - 0.75. Near the budget a right answer can score below a short wrong one, as DAPO intends.
    trajs = [_traj(5, 80, "Rome"), _traj(15, 80, "Paris"), _traj(5, 5, "Rome")]
    cfg = RewardConfig(format_score=0.2, overlong_buffer_tokens=BUFFER, overlong_penalty_factor=1.0)
    results = score_trajectories(trajs, _prompts(3), cfg, BUDGET)
    assert [r.components["format"] for r in results] == [1.0, 1.0, 1.0]
    assert [r.score for r in results] == pytest.approx([0.2 - 0.25, 1.0 - 0.75, 0.2])


def test_off_by_default_scores_are_unchanged():
    trajs = [_traj(10, 89, "Paris"), _traj(10, 89, "Rome")]
    results = score_trajectories(trajs, _prompts(2), RewardConfig())  # no budget needed when off
    assert [r.score for r in results] == [1.0, 0.0] and all("overlong_penalty" not in r.components for r in results)


def test_errors_name_the_keys():
    with pytest.raises(ValueError, match="pass max_response_tokens"):
        score_trajectories([_traj(2, 2, "Paris")], _prompts(1), RewardConfig(overlong_buffer_tokens=8))
    with pytest.raises(ConfigError, match="reward.overlong_buffer_tokens"):
        RewardConfig(overlong_buffer_tokens=-1)
    with pytest.raises(ConfigError, match="reward.overlong_penalty_factor"):
        RewardConfig(overlong_buffer_tokens=8, overlong_penalty_factor=-0.5)
    cfg = load_config(["reward.overlong_buffer_tokens=1024", "actor_rollout_ref.rollout.max_response_tokens=1024"])
    with pytest.raises(ConfigError, match="reward.overlong_buffer_tokens=1024 must be below actor_rollout_ref.rollout"):
        cfg.validate(max_model_len=8192)
