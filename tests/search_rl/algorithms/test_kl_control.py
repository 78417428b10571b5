"""KL-in-reward controllers (fixed, adaptive) and ``apply_kl_penalty`` against hand-computed values.

Run: python -m pytest tests/search_rl/algorithms/test_kl_control.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.algorithms import AdaptiveKLController, FixedKLController, apply_kl_penalty, build_kl_controller
from search_rl.config import AlgorithmConfig


def test_adaptive_controller_hand_computed():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=1000)
    # KL 0.11: error 0.11 / 0.1 - 1 = 0.1 (inside +-0.2); 0.2 * (1 + 0.1 * 100 / 1000) = 0.202
    ctrl.update(current_kl=0.11, n_steps=100)
    assert ctrl.value == pytest.approx(0.202)
    # KL 0.5: error 4 clipped to 0.2; 0.202 * (1 + 0.2 * 100 / 1000) = 0.20604
    ctrl.update(current_kl=0.5, n_steps=100)
    assert ctrl.value == pytest.approx(0.20604)
    # KL 0: error -1 clipped to -0.2; 0.20604 * (1 - 0.2 * 500 / 1000) = 0.185436
    ctrl.update(current_kl=0.0, n_steps=500)
    assert ctrl.value == pytest.approx(0.185436)
    # On target: unchanged
    ctrl.update(current_kl=0.1, n_steps=500)
    assert ctrl.value == pytest.approx(0.185436)


def test_controller_state_round_trip():
    ctrl = AdaptiveKLController(0.2, 0.1, 1000)
    ctrl.update(0.5, 100)
    resumed = AdaptiveKLController(0.2, 0.1, 1000)
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == ctrl.value


def test_build_kl_controller_from_config():
    fixed = build_kl_controller(AlgorithmConfig(kl_coef=0.03))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.03
    fixed.update(current_kl=10.0, n_steps=64)
    assert fixed.value == 0.03
    adaptive = build_kl_controller(AlgorithmConfig(kl_ctrl_type="adaptive", kl_coef=0.05, kl_target=2.0))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.target_kl == 2.0 and adaptive.value == 0.05


def test_apply_kl_penalty_only_on_masked_tokens_and_updates_controller():
    # k1 per token = logprobs - ref = [0.5, 2.0 (observation), 0.25] and [1.0, 0, 0 (padding)].
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    logprobs = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -3.0, -1.25], [-2.0, -1.0, -9.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=20)
    rewards, metrics = apply_kl_penalty(scores, logprobs, ref, mask, ctrl, "k1")
    # rewards = scores - 0.1 * kl on model tokens only
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 0.975], [-0.1, 0.0, 0.0]]))
    # per-sample mean KL over model tokens: (0.5 + 0.25) / 2 = 0.375 and 1.0 -> batch 0.6875
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.6875)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # update with n_steps = 2: error 0.6875 / 0.5 - 1 = 0.375 -> 0.2; 0.1 * (1 + 0.2 * 2 / 20) = 0.102
    assert ctrl.value == pytest.approx(0.102)


def test_apply_kl_penalty_low_var_kl_is_non_negative():
    gen = torch.Generator().manual_seed(0)
    logprobs, ref = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    scores = torch.zeros(3, 5)
    rewards, _ = apply_kl_penalty(scores, logprobs, ref, torch.ones(3, 5), FixedKLController(1.0), "low_var_kl")
    assert torch.all(rewards <= 0)
