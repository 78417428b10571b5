"""GSPO (sequence-level importance ratio): hand-computed loss, gradients and metrics; observation tokens out of the
sequence ratio; equal to PPO clip when every token of a sequence has the sequence's ratio.

Run: python -m pytest tests/search_rl/algorithms/test_gspo.py -q
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from numerics import FP32_EPS

import search_rl.algorithms.gspo as gspo_module
from search_rl.algorithms import POLICY_LOSSES, compute_actor_loss
from search_rl.config import AlgorithmConfig

# Two responses, per-token log-ratios (logprobs - old_logprobs); the 0-mask tokens (an observation in each) carry
# large log-ratios that must not enter the sequence ratio.
#   seq 0: mask 1 1 1 0, log-ratios 0.1 -0.3 0.5 | 9.0  -> log s = 0.3 / 3 = 0.1  -> s = e^0.1  = 1.105171, A = +1
#   seq 1: mask 1 1 0 1, log-ratios -0.2 -0.4 | 7.0 | 0.0 -> log s = -0.6 / 3 = -0.2 -> s = e^-0.2 = 0.818731, A = -1
# Clip range [1 - 0.1, 1 + 0.2] = [0.9, 1.2]:
#   seq 0: 1.105 inside: per-token loss -A s = -1.105171 (unclipped term, gradient flows)
#   seq 1: 0.819 below 0.9: -A s = 0.818731, -A clip(s) = 0.9, max = 0.9 (clipped term, no gradient)
LOG_RATIO = [[0.1, -0.3, 0.5, 9.0], [-0.2, -0.4, 7.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 1]]
ADV = [[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]]
S0, S1 = math.exp(0.1), math.exp(-0.2)
HAND_ATOL = 8 * FP32_EPS * 2
"""float32 results of a few ops (a mean of up to 6 log-ratios, an exp, a clip, a mean of 2) on this module's hand
values, all of size < 2, against exact arithmetic: under 8 roundings of eps at that size (1.9e-6)."""


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.full((2, 4), -2.0)
    logprobs = (old + torch.tensor(LOG_RATIO)).requires_grad_(True)
    return logprobs, old, torch.tensor(ADV), torch.tensor(MASK)


def test_gspo_hand_computed_loss_gradient_and_metrics():
    cfg = AlgorithmConfig(
        policy_loss="gspo", clip_ratio_low=0.1, clip_ratio_high=0.2, loss_agg_mode="seq-mean-token-mean"
    )
    logprobs, old, adv, mask = _inputs()
    loss, metrics = POLICY_LOSSES.get("gspo")(logprobs, old, adv, mask, cfg)
    assert loss.item() == pytest.approx((-S0 + 0.9) / 2, abs=HAND_ATOL)  # mean over the two sequences' token means
    loss.backward()
    # seq 0: d/d logp_t of (1/2)(1/3) sum_t -A s_t = -s0 / 6 on each of its 3 model tokens; seq 1 is clipped.
    expected = torch.tensor([[-S0 / 6, -S0 / 6, -S0 / 6, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)
    assert metrics["actor/clipfrac"] == pytest.approx(3 / 6)  # seq 1's three model tokens
    assert metrics["actor/seq_clipfrac"] == pytest.approx(1 / 2)
    assert metrics["actor/seq_ratio_mean"] == pytest.approx((S0 + S1) / 2, abs=HAND_ATOL)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(0.1 - 0.3 + 0.5 - 0.2 - 0.4 + 0.0) / 6, abs=HAND_ATOL)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0 and metrics["actor/pg_loss"] == pytest.approx(loss.item())


def test_gspo_clips_the_sequence_not_the_token():
    # Log-ratios +1 and -1 average to s = 1: neither token is clipped (PPO clip would clip the first, r = e),
    # and both tokens get the gradient -A * s / 2 = -0.5.
    cfg = AlgorithmConfig(
        policy_loss="gspo", clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="seq-mean-token-mean"
    )
    old = torch.zeros(1, 2)
    logprobs = torch.tensor([[1.0, -1.0]], requires_grad=True)
    loss, metrics = POLICY_LOSSES.get("gspo")(logprobs, old, torch.ones(1, 2), torch.ones(1, 2), cfg)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0) and metrics["actor/clipfrac"] == 0.0
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.5, -0.5]]))
    _, ppo_metrics = POLICY_LOSSES.get("ppo_clip")(logprobs, old, torch.ones(1, 2), torch.ones(1, 2), cfg)
    assert ppo_metrics["actor/clipfrac"] == pytest.approx(0.5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gspo_equals_ppo_clip_when_each_token_has_the_sequence_ratio(agg):
    # Token log-ratio = sequence mean on every model token, so s_i = r_it; dual clip off: the two losses and their
    # gradients agree for any aggregation (masked tokens may hold anything).
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e9, loss_agg_mode=agg)
    old = torch.full((3, 3), -1.5)
    per_seq = torch.tensor([[0.4], [-0.5], [0.05]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    shifted = old + per_seq.expand(3, 3) + 5.0 * (1 - mask)  # junk where the mask is 0
    adv = torch.tensor([[1.0], [-1.0], [2.0]]).expand(3, 3)
    grads, losses = [], []
    for name in ("gspo", "ppo_clip"):
        logprobs = shifted.clone().requires_grad_(True)
        loss, _ = POLICY_LOSSES.get(name)(logprobs, old, adv, mask, cfg)
        loss.backward()
        losses.append(loss.item())
        grads.append(logprobs.grad * mask)
    assert losses[0] == pytest.approx(losses[1], abs=HAND_ATOL)
    torch.testing.assert_close(grads[0], grads[1])


def test_gspo_through_compute_actor_loss_and_config():
    cfg = AlgorithmConfig(policy_loss="gspo", use_kl_loss=False, loss_agg_mode="seq-mean-token-mean")
    logprobs, old, adv, mask = _inputs()
    loss, metrics = compute_actor_loss(logprobs, old, adv, mask, cfg)
    assert metrics["actor/loss"] == pytest.approx(loss.item()) and "actor/seq_ratio_mean" in metrics
    # Defaults (clip 0.2 / 0.2): seq 1's 0.819 is inside [0.8, 1.2], so nothing is clipped.
    assert metrics["actor/clipfrac"] == 0.0
    assert loss.item() == pytest.approx((-S0 + S1) / 2, abs=HAND_ATOL)


def test_gspo_sequence_without_model_tokens_counts_nothing():
    cfg = AlgorithmConfig(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean")
    old = torch.zeros(2, 2)
    logprobs = torch.tensor([[0.1, 0.1], [30.0, 30.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 0]])
    loss, metrics = POLICY_LOSSES.get("gspo")(logprobs, old, torch.ones(2, 2), mask, cfg)
    assert loss.item() == pytest.approx(-math.exp(0.1), abs=HAND_ATOL)
    assert metrics["actor/seq_ratio_mean"] == pytest.approx(math.exp(0.1), abs=HAND_ATOL)
    assert metrics["actor/seq_clipfrac"] == 0.0


def test_gspo_docstring_examples():
    result = doctest.testmod(gspo_module)
    assert result.attempted > 0 and result.failed == 0
