"""Datatypes: validation in __post_init__, RolloutBatch collation layout and default group ids.

Run: python -m pytest tests/search_rl/test_datatypes.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.datatypes import Generated, RolloutBatch, SamplingParams, Segment, Trajectory, TrajectoryStats

PAD = 0


def _traj(prompt: list[int], response: list[int], mask: list[int]) -> Trajectory:
    return Trajectory(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(response),
        response_mask=torch.tensor(mask),
        rollout_logprobs=torch.tensor([-0.5 if m else 0.0 for m in mask]),
        segments=(Segment("model", 0, len(response), "x"),),
        final_answer=None,
        stop_reason="max_turns",
        stats=TrajectoryStats(),
    )


def test_collation_pads_prompt_left_and_response_right():
    a = _traj([11, 12, 13], [21, 22, 23, 24], [1, 0, 0, 1])
    b = _traj([14], [25], [1])
    batch = RolloutBatch.from_trajectories([a, b], PAD, group_ids=[5, 5])
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24], [PAD, PAD, 14, 25, PAD, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 7, [0, 0, 1, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[1, 0, 0, 1], [1, 0, 0, 0]]
    assert batch.rollout_logprobs.tolist() == [[-0.5, 0, 0, -0.5], [-0.5, 0, 0, 0]]
    assert batch.response_ids.tolist() == [[21, 22, 23, 24], [25, PAD, PAD, PAD]]
    assert batch.group_ids.tolist() == [5, 5] and batch.prompt_length == 3 and len(batch) == 2


def test_default_group_ids_are_one_per_trajectory():
    trajs = [_traj([1, 2], [3] * (i + 1), [1] * (i + 1)) for i in range(5)]
    batch = RolloutBatch.from_trajectories(trajs, PAD)
    assert batch.group_ids.tolist() == [0, 1, 2, 3, 4]


def test_inconsistent_batch_sizes_raise():
    batch = RolloutBatch.from_trajectories([_traj([1], [2], [1])], PAD)
    with pytest.raises(ValueError, match="disagree on batch size"):
        RolloutBatch(**{**batch.__dict__, "group_ids": torch.tensor([0, 1])})


def test_validation_errors():
    with pytest.raises(ValueError, match="response_mask shape"):
        Trajectory(
            torch.tensor([1]), torch.tensor([1, 2]), torch.tensor([1]), None, (), None, "answer", TrajectoryStats()
        )
    with pytest.raises(ValueError, match="2 logprobs for 1 tokens"):
        Generated((1,), "length", None, (0.0, 0.0))
    with pytest.raises(ValueError, match="stop_str"):
        Generated((1,), "stop", None)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="empty stop string"):
        SamplingParams(stop=("",))
    assert SamplingParams(temperature=0.0, greedy=True).greedy


def test_trajectory_views():
    t = _traj([1, 2], [3, 4, 5], [1, 0, 1])
    assert t.attention_mask.tolist() == [1] * 5 and t.position_ids.tolist() == [0, 1, 2, 3, 4]
    assert t.model_texts == ("x",) and t.num_searches == 0
