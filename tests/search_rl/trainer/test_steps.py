"""The driver's per-batch steps: collation to a fixed response width, reward placement, advantages, metric merging.

Run: python -m pytest tests/search_rl/trainer/test_steps.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from numerics import FP32_EPS

from search_rl.algorithms import FixedKLController
from search_rl.algorithms.advantages import GROUP_STD_EPS
from search_rl.batches import BatchMeta, PromptBatch
from search_rl.config import AlgorithmConfig
from search_rl.datatypes import RolloutResult, Segment, Trajectory, TrajectoryStats
from search_rl.reward.scoring import reward_metrics
from search_rl.trainer.steps import (
    build_train_batch,
    compute_advantages,
    failed_search_mask,
    merge_rollout_metrics,
    old_logprob_source,
    place_scores,
    search_failure_rate,
)

PAD = 0


def _traj(prompt: list[int], mask: list[int]) -> Trajectory:
    response = list(range(100, 100 + len(mask)))
    return Trajectory(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(response),
        response_mask=torch.tensor(mask),
        rollout_logprobs=torch.tensor([-0.5 * m for m in mask], dtype=torch.float32),
        segments=(Segment("model", 0, len(mask), "x"),),
        final_answer=None,
        stop_reason="answer",
        stats=TrajectoryStats(turns=1),
    )


def _prompts(uids: list[str]) -> PromptBatch:
    n = len(uids)
    return PromptBatch(((1,),) * n, tuple(uids), ("nq",) * n, (("a",),) * n, ("q",) * n, tuple(range(n)))


def test_batch_is_padded_to_the_response_budget():
    trajs = [_traj([1, 2, 3], [1, 1, 0, 0, 1]), _traj([4], [1, 1])]
    batch = build_train_batch(trajs, _prompts(["a", "b"]), PAD, response_width=8, meta=BatchMeta(step=3))
    assert batch.response_ids.shape == (2, 8) and batch.input_ids.shape == (2, 3 + 8)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.response_attention_mask.tolist() == [[1] * 5 + [0] * 3, [1, 1] + [0] * 6]
    assert batch.attention_mask[1].tolist()[:3] == [0, 0, 1]  # prompt left-padded
    assert batch.position_ids[1].tolist()[2:5] == [0, 1, 2]
    assert batch.uids == ("a", "b") and batch.meta.step == 3


def test_outcome_reward_sits_on_the_last_model_token():
    trajs = [_traj([1], [1, 1, 0, 0]), _traj([1], [1, 0, 1, 0, 0])]  # budget ran out inside an observation
    batch = build_train_batch(trajs, _prompts(["a", "b"]), PAD, response_width=6, meta=BatchMeta())
    scores = place_scores(batch, [1.0, 0.5])
    assert scores.tolist() == [[0, 1.0, 0, 0, 0, 0], [0, 0, 0.5, 0, 0, 0]]


def test_grpo_advantages_use_groups_and_the_loss_mask():
    trajs = [_traj([1], [1, 0, 1]), _traj([1], [1, 1, 1]), _traj([2], [1, 1, 0]), _traj([2], [1, 1, 1])]
    batch = build_train_batch(trajs, _prompts(["g1", "g1", "g2", "g2"]), PAD, 4, BatchMeta())
    batch = batch.replace(token_level_scores=place_scores(batch, [1.0, 0.0, 0.0, 0.0]))
    algo = AlgorithmConfig(adv_estimator="grpo")
    out, metrics = compute_advantages(batch, algo, kl_ctrl=None)
    assert torch.equal(out.loss_mask, batch.response_mask)
    expected = 0.5 / (0.5**0.5 + GROUP_STD_EPS)  # (1 - 0.5) / (std([1, 0]) + eps), float32 to a few roundings
    assert out.advantages[0].tolist() == pytest.approx([expected, 0, expected, 0], rel=8 * FP32_EPS, abs=0)
    assert out.advantages[2].abs().sum() == 0  # both samples of g2 got 0: no signal
    assert "critic/advantages_mean" in metrics

    unmasked, _ = compute_advantages(batch, AlgorithmConfig(adv_estimator="grpo", mask_observations=False), None)
    assert unmasked.loss_mask[0].tolist() == [1, 1, 1, 0]  # the observation token now counts, padding does not
    assert unmasked.advantages[0, 1] != 0


def test_kl_in_reward_needs_logprobs_and_applies_the_penalty():
    trajs = [_traj([1], [1, 1]), _traj([1], [1, 1])]
    batch = build_train_batch(trajs, _prompts(["g", "g"]), PAD, 2, BatchMeta())
    batch = batch.replace(token_level_scores=place_scores(batch, [1.0, 0.0]))
    algo = AlgorithmConfig(adv_estimator="rloo", use_kl_in_reward=True, kl_coef=0.1)
    with pytest.raises(ValueError, match="old_logprobs"):
        compute_advantages(batch, algo, FixedKLController(0.1))
    batch = batch.replace(old_logprobs=torch.full((2, 2), -1.0), ref_logprobs=torch.full((2, 2), -2.0))
    out, metrics = compute_advantages(batch, algo, FixedKLController(0.1))
    assert out.token_level_rewards.flatten().tolist() == pytest.approx([-0.1, 0.9, -0.1, -0.1])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(1.0)


def test_merged_rollout_metrics_and_reward_metrics():
    a = RolloutResult(
        [_traj([1], [1])] * 2, {"rollout/turns_mean": 1.0, "rollout/retriever_errors": 1.0, "timing/generate_s": 2.0}
    )
    b = RolloutResult(
        [_traj([1], [1])] * 2, {"rollout/turns_mean": 3.0, "rollout/retriever_errors": 2.0, "timing/generate_s": 5.0}
    )
    merged = merge_rollout_metrics([a, b])
    assert merged == {"rollout/turns_mean": 2.0, "rollout/retriever_errors": 3.0, "timing/generate_s": 5.0}

    from search_rl.datatypes import RewardResult

    results = [RewardResult(1.0, {"em": 1.0}), RewardResult(0.0, {"em": 0.0}), RewardResult(0.0, {"em": 0.0})]
    m = reward_metrics(results, ["nq", "nq", "hotpotqa"], ["g1", "g1", "g2"])
    assert m["reward/nq/em"] == 0.5 and m["reward/hotpotqa/em"] == 0.0
    assert m["reward/groups_all_equal"] == 0.0  # g1 has a spread; g2 (one sample) has none to measure: left out
    assert m["reward/groups_all_equal_em"] == 0.0
    m = reward_metrics(results, ["nq", "nq", "hotpotqa"], ["g1", "g2", "g2"])
    assert m["reward/groups_all_equal"] == 1.0  # g2's two samples both got 0: no GRPO signal


def test_left_out_samples_get_no_loss_tokens_and_no_share_in_their_group():
    trajs = [_traj([1], [1, 1, 1]) for _ in range(4)]
    trajs[1] = dataclasses.replace(trajs[1], stats=TrajectoryStats(turns=2, searches=1, retriever_errors=1))
    keep = failed_search_mask(trajs)
    assert keep.tolist() == [1, 0, 1, 1] and search_failure_rate(trajs) == (1, 1)
    batch = build_train_batch(trajs, _prompts(["g"] * 4), PAD, 3, BatchMeta())
    batch = batch.replace(token_level_scores=place_scores(batch, [1.0, 1.0, 0.0, 0.0]), sample_mask=keep)
    out, _ = compute_advantages(batch, AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std=False), kl_ctrl=None)
    assert out.loss_mask[1].sum() == 0 and out.loss_mask[[0, 2, 3]].sum() == 9
    assert out.advantages[1].abs().sum() == 0
    # the group's baseline is the mean of the 3 kept samples (1/3), not of all 4 (1/2)
    assert out.advantages[0, 0].item() == pytest.approx(2 / 3) and out.advantages[2, 0].item() == pytest.approx(-1 / 3)


@pytest.mark.parametrize(
    ("mode", "fresh", "on_policy", "matches", "before", "one_epoch", "expected"),
    [
        ("auto", True, True, False, False, True, "current"),  # one step over fresh weights: the ratio is 1
        ("auto", True, True, True, True, True, "rollout"),  # the KL-in-reward needs them before the update
        ("auto", True, False, True, False, True, "rollout"),  # several mini-batches, engine = trainer numerics
        ("auto", True, False, False, False, True, "update"),  # vLLM / bf16, one epoch: the update computes them
        ("auto", True, False, False, False, False, "recompute"),  # vLLM / bf16, several epochs
        ("auto", True, False, False, True, True, "recompute"),  # the KL-in-reward needs them before the update
        ("auto", False, True, True, False, False, "recompute"),  # a stale batch (asynchronous training)
        ("auto", False, True, True, False, True, "update"),  # stale, one epoch: the current weights' values too
        ("recompute", True, True, True, False, True, "recompute"),
        ("rollout", False, False, False, False, False, "rollout"),
    ],
)
def test_old_logprob_source(mode, fresh, on_policy, matches, before, one_epoch, expected):
    got = old_logprob_source(
        mode,
        fresh=fresh,
        on_policy_update=on_policy,
        engine_matches_trainer=matches,
        needed_before_update=before,
        one_epoch=one_epoch,
    )
    assert got == expected
