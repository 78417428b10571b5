"""A deterministic test reward for the training tests: it varies between samples (so group advantages are non-zero)
and depends only on the sampled token ids (so two runs that sample the same tokens score the same)."""

from __future__ import annotations

from search_rl.datatypes import GroundTruth, RewardResult, Trajectory
from search_rl.reward import REWARDS
from search_rl.reward.scorers import qa_components

CHECKSUM_REWARD = "test_checksum"
"""The name the reward is registered under (``reward.default=test_checksum``)."""


def checksum_reward(trajectory: Trajectory, ground_truth: GroundTruth) -> RewardResult:
    """A reward in {0, 0.25, .., 1} from the sum of the sampled token ids, with the QA components for the metrics."""
    sampled = trajectory.response_ids[trajectory.response_mask == 1]
    return RewardResult((int(sampled.sum()) % 5) / 4, qa_components(trajectory, ground_truth))


if CHECKSUM_REWARD not in REWARDS:
    REWARDS.register(CHECKSUM_REWARD)(checksum_reward)
