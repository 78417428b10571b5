"""Truncated importance sampling over the rollout/trainer mismatch (``algorithm.tis_cap``), against hand-computed
weights and losses.

Run: python -m pytest tests/search_rl/algorithms/test_tis.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from search_rl.algorithms.losses import compute_actor_loss, truncated_is_weights
from search_rl.config import AlgorithmConfig


def test_weights_are_the_truncated_ratio_of_trainer_to_engine():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is an observation: not counted
    weights, metrics = truncated_is_weights(old, rollout, mask, cap=1.5)
    expected = torch.tensor([[min(math.exp(0.5), 1.5), math.exp(-1.0), 1.0, 1.5]])
    torch.testing.assert_close(weights, expected)
    assert metrics["actor/tis_weight_mean"] == pytest.approx((1.5 + math.exp(-1.0) + 1.0) / 3)
    assert metrics["actor/tis_truncated_frac"] == pytest.approx(1 / 3)
    assert metrics["actor/rollout_trainer_logprob_diff"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)


def test_actor_loss_scales_each_tokens_advantage_by_its_weight():
    # ratio 1 (logprobs == old): the PPO loss per token is -A * w; token-mean over the two masked tokens
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = logprobs.detach().clone()
    rollout = torch.tensor(
        [[-1.0 - math.log(2.0), -2.0 + math.log(4.0), -3.0]]
    )  # weights 2 and 0.25, both under the cap
    adv = torch.tensor([[1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    algo = AlgorithmConfig(adv_estimator="grpo", use_kl_loss=False, tis_cap=3.0)
    loss, metrics = compute_actor_loss(logprobs, old, adv, mask, algo, rollout_logprobs=rollout)
    assert loss.item() == pytest.approx(-(1.0 * 2.0 + (-2.0) * 0.25) / 2)
    loss.backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, 0.25, 0.0]]))  # d/dlogp of -A w ratio / 2
    assert metrics["actor/tis_weight_mean"] == pytest.approx((2.0 + 0.25) / 2)
    off, _ = compute_actor_loss(logprobs, old, adv, mask, AlgorithmConfig(adv_estimator="grpo", use_kl_loss=False))
    assert off.item() == pytest.approx(-(1.0 - 2.0) / 2)


def test_tis_needs_the_engine_logprobs_and_a_cap_of_at_least_one():
    t = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        compute_actor_loss(t, t, t, t + 1, AlgorithmConfig(adv_estimator="grpo", use_kl_loss=False, tis_cap=2.0))
    with pytest.raises(ValueError, match="algorithm.tis_cap"):
        AlgorithmConfig(tis_cap=0.5)
