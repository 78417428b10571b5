"""Datatypes: validation in __post_init__, and the one collation of trajectories (``TrainBatch.from_trajectories``).

Run: python -m pytest tests/search_rl/test_datatypes.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.batches import TrainBatch
from search_rl.datatypes import Generated, SamplingParams, Segment, Trajectory, TrajectoryStats

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
    batch = TrainBatch.from_trajectories([a, b], ["q5", "q5"], ["nq", "nq"], pad_token_id=PAD)
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24], [PAD, PAD, 14, 25, PAD, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 7, [0, 0, 1, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[1, 0, 0, 1], [1, 0, 0, 0]]
    assert batch.rollout_logprobs.tolist() == [[-0.5, 0, 0, -0.5], [-0.5, 0, 0, 0]]
    assert batch.response_ids.tolist() == [[21, 22, 23, 24], [25, PAD, PAD, PAD]]
    assert batch.uids == ("q5", "q5") and batch.prompt_length == 3 and len(batch) == 2


def test_collation_pads_responses_to_the_fixed_width_once():
    batch = TrainBatch.from_trajectories([_traj([7, 8], [9], [1])], ["q"], ["nq"], pad_token_id=PAD, response_width=4)
    assert batch.response_ids.tolist() == [[9, PAD, PAD, PAD]] and batch.response_mask.tolist() == [[1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 2, 2, 2]] and batch.prompt_length == 2


def test_collation_needs_one_uid_and_source_per_trajectory():
    trajs = [_traj([1, 2], [3] * (i + 1), [1] * (i + 1)) for i in range(5)]
    with pytest.raises(ValueError, match="5 trajectories but 4 uids"):
        TrainBatch.from_trajectories(trajs, ["q"] * 4, ["nq"] * 5, pad_token_id=PAD)
    with pytest.raises(ValueError, match="no trajectories"):
        TrainBatch.from_trajectories([], [], [], pad_token_id=PAD)


def test_inconsistent_batch_sizes_raise():
    batch = TrainBatch.from_trajectories([_traj([1], [2], [1])], ["q"], ["nq"], pad_token_id=PAD)
    with pytest.raises(ValueError, match="disagree on batch size"):
        batch.replace(response_mask=torch.zeros((2, 1), dtype=torch.long))


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
