"""PPO clip (asymmetric, dual-clip), value loss, entropy, KL estimators, aggregation modes and observation masking.

Run: python -m pytest tests/search_rl/algorithms/test_losses.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from numerics import FP32_EPS

from search_rl.algorithms import (
    ADVANTAGES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    aggregate_loss,
    compute_actor_loss,
    compute_value_loss,
    entropy_from_logits,
    estimate_kl,
    loss_mask_for,
)
from search_rl.config import AlgorithmConfig

# Six tokens, clip range [1 - 0.2, 1 + 0.28], dual-clip c = 3. Per-token loss -A * r, hand-computed:
#   A  ratio  unclipped  clipped(r)         max (PPO)   dual: min(., 3)  clipped? dual?
#  +1  1.5    -1.5       -1.28 (r->1.28)    -1.28       -                yes      no
#  +1  0.5    -0.5       -0.8  (r->0.8)     -0.5        -                no       no
#  -1  0.5     0.5        0.8  (r->0.8)      0.8         0.8             yes      no
#  -1  5.0     5.0        1.28 (r->1.28)     5.0         3.0             no       yes
#  -1  2.0     2.0        1.28               2.0         2.0             no       no
#  +1  1.25   -1.25      -1.25 (inside 1.28) -1.25      -                no       no  (symmetric 0.2 would clip)
ADV = [1.0, 1.0, -1.0, -1.0, -1.0, 1.0]
RATIO = [1.5, 0.5, 0.5, 5.0, 2.0, 1.25]
PER_TOKEN = [-1.28, -0.5, 0.8, 3.0, 2.0, -1.25]
HAND_ATOL = 16 * FP32_EPS * 5
"""float32 results of a handful of ops (log, exp, a clip, a product, a mean of up to 6 terms) on the hand values of
this module, all of size <= 5, against exact arithmetic: under 16 roundings of eps at that size (9.5e-6)."""


def _ppo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.full((1, 6), -1.0)
    logprobs = (old + torch.log(torch.tensor([RATIO]))).requires_grad_(True)
    return logprobs, old, torch.tensor([ADV])


def test_ppo_clip_asymmetric_and_dual_clip_hand_computed():
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    logprobs, old, adv = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logprobs, old, adv, torch.ones(1, 6), cfg)
    assert loss.item() == pytest.approx(sum(PER_TOKEN) / 6, abs=HAND_ATOL)  # token-mean of 2.77 over 6 tokens
    assert metrics["actor/clipfrac"] == pytest.approx(2 / 6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 6)
    # ppo_kl = mean(old - new) = -mean(log ratio)
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(r) for r in RATIO) / 6, abs=HAND_ATOL)
    # Gradient flows only where the unclipped term is selected: d(-A r)/d logp = -A r, divided by 6 tokens.
    loss.backward()
    expected_grad = [0.0, -0.5 / 6, 0.0, 0.0, 2.0 / 6, -1.25 / 6]
    torch.testing.assert_close(logprobs.grad, torch.tensor([expected_grad]))


def test_ppo_clip_symmetric_range_clips_the_last_token():
    # With clip_ratio_high = 0.2 the 6th token's ratio 1.25 is clipped to 1.2: its loss is -1.2 and
    # the first token's -1.2 (instead of -1.28).
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    logprobs, old, adv = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logprobs, old, adv, torch.ones(1, 6), cfg)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0 + 2.0 - 1.2) / 6, abs=HAND_ATOL)
    assert metrics["actor/clipfrac"] == pytest.approx(3 / 6)


def test_ppo_clip_without_dual_clip_keeps_large_negative_losses():
    # A huge clip_ratio_c turns dual-clip off: the 4th token keeps its loss 5.0.
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e9)
    logprobs, old, adv = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logprobs, old, adv, torch.ones(1, 6), cfg)
    assert loss.item() == pytest.approx((sum(PER_TOKEN) - 3.0 + 5.0) / 6, abs=HAND_ATOL)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_ppo_clip_ignores_masked_tokens():
    cfg = AlgorithmConfig(clip_ratio_high=0.28)
    logprobs, old, adv = _ppo_inputs()
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]])
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logprobs, old, adv, mask, cfg)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 2.0 - 1.25) / 4, abs=HAND_ATOL)


LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # the third sequence has no token


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 2.5 over the 4 selected tokens
        ("seq-mean-token-sum", (6 + 4) / 2),  # sums 6 and 4; the empty sequence is left out -> 5
        ("seq-mean-token-mean", (2 + 4) / 2),  # means 2 and 4 -> 3
        ("seq-mean-token-sum-norm", (6 / 4 + 4 / 4) / 2),  # sums over T = 4 -> 1.25
    ],
)
def test_aggregation_modes_hand_computed(mode: str, expected: float):
    assert aggregate_loss(LOSS_MAT, AGG_MASK, mode).item() == pytest.approx(expected)


def test_aggregation_of_an_empty_mask_is_zero_not_nan():
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert aggregate_loss(LOSS_MAT, torch.zeros(3, 4), mode).item() == 0.0


def test_value_loss_hand_computed():
    # value_clip 0.5, old values 1. Token 0: V = 2 -> clipped 1.5, R = 3: max(1, 2.25) = 2.25 (clipped branch)
    # Token 1: V = 1.25 (inside), R = 0: max(1.5625, 1.5625). Token 2 masked. 0.5 * mean(2.25, 1.5625) = 0.953125
    cfg = AlgorithmConfig(value_clip=0.5)
    values = torch.tensor([[2.0, 1.25, 50.0]], requires_grad=True)
    loss, metrics = compute_value_loss(
        values, torch.ones(1, 3), torch.tensor([[3.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0]]), cfg
    )
    assert loss.item() == pytest.approx(0.953125)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["critic/vpred_mean"] == pytest.approx(1.625)
    loss.backward()
    # clipped branch selected for token 0 (its prediction is outside the clip range): no gradient;
    # token 1: d/dV 0.5 * V^2 / 2 tokens = V / 2 = 0.625
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.625, 0.0]]))


def test_entropy_from_logits_known_distributions():
    logits = torch.stack([torch.zeros(8), torch.tensor([0.0, 0, 0, 0, -1e4, -1e4, -1e4, -1e4]), torch.eye(8)[0] * 50])
    entropy = entropy_from_logits(logits[None])  # (1, 3): uniform over 8, uniform over 4, one-hot
    torch.testing.assert_close(entropy, torch.tensor([[math.log(8), math.log(4), 0.0]]), atol=HAND_ATOL, rtol=0)
    # masked as the actor loss aggregates it: only the first two positions count -> (log 8 + log 4) / 2
    mean = aggregate_loss(entropy, torch.tensor([[1, 1, 0]]), "token-mean")
    assert mean.item() == pytest.approx((math.log(8) + math.log(4)) / 2, abs=HAND_ATOL)


# p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4): KL(p || q) = 1/2 ln 2 - 1/4 ln 2 + 0 = 1/4 ln 2 = 0.173287
P = torch.tensor([0.5, 0.25, 0.25])
Q = torch.tensor([0.25, 0.5, 0.25])
KL_PQ = 0.25 * math.log(2)


@pytest.mark.parametrize("name", ["k1", "low_var_kl"])
def test_unbiased_kl_estimators_have_the_exact_expectation(name: str):
    # E_{x~p}[k1] = sum p log(p/q) = KL; E_{x~p}[k3] = sum p (q/p - 1 - log(q/p)) = sum q - 1 + KL = KL
    per_token = estimate_kl(P.log(), Q.log(), name)
    assert (P * per_token).sum().item() == pytest.approx(KL_PQ, abs=HAND_ATOL)


def test_k2_expectation_and_pointwise_values():
    # E_p[0.5 (log p/q)^2] = 0.5 * (1/2 ln2^2 + 1/4 ln2^2 + 0) = 0.375 ln2^2 = 0.180166
    assert (P * estimate_kl(P.log(), Q.log(), "k2")).sum().item() == pytest.approx(0.375 * math.log(2) ** 2)
    # pointwise at log p = -1, log q = -3: k1 = 2, k2 = 2, k3 = e^-2 + 2 - 1 = 1.135335
    lp, lq = torch.tensor([-1.0]), torch.tensor([-3.0])
    assert estimate_kl(lp, lq, "k1").item() == pytest.approx(2.0)
    assert estimate_kl(lp, lq, "k2").item() == pytest.approx(2.0)
    assert estimate_kl(lp, lq, "low_var_kl").item() == pytest.approx(math.exp(-2) + 1, abs=HAND_ATOL)


def test_low_var_kl_is_clamped_like_verl():
    # log-ratio clamped to +-20, then the estimate to +-10: both extremes give 10
    out = estimate_kl(torch.tensor([0.0, 0.0]), torch.tensor([-100.0, 100.0]), "low_var_kl")
    torch.testing.assert_close(out, torch.tensor([10.0, 10.0]))


def test_verl_kl_aliases():
    assert KL_ESTIMATORS.get("kl") is KL_ESTIMATORS.get("k1")
    assert KL_ESTIMATORS.get("mse") is KL_ESTIMATORS.get("k2")
    assert KL_ESTIMATORS.get("k3") is KL_ESTIMATORS.get("low_var_kl")


def test_loss_mask_for_switch():
    response_mask = torch.tensor([[1, 1, 0, 0, 1, 0]])  # observation at 2-3, padding at 5
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]])  # left-padded prompt of 2, then the 6 response tokens
    assert loss_mask_for(response_mask, attention, AlgorithmConfig()) is response_mask
    off = loss_mask_for(response_mask, attention, AlgorithmConfig(mask_observations=False))
    torch.testing.assert_close(off, torch.tensor([[1, 1, 1, 1, 1, 0]]))
    with pytest.raises(ValueError, match="fewer than the 6 response tokens"):
        loss_mask_for(response_mask, attention[:, :3], AlgorithmConfig(mask_observations=False))


# Row 0: model, observation (2-4), model, padding. Row 1: model, observation (1-2), model, observation (6-7).
RESPONSE_MASK = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1, 0, 0]])
ATTENTION = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])


def _actor_loss_grads(mask_observations: bool) -> torch.Tensor:
    """d(actor loss)/d(logprobs) for a fixed batch, with advantages computed on the same mask as the loss."""
    gen = torch.Generator().manual_seed(0)
    cfg = AlgorithmConfig(
        adv_estimator="grpo",
        mask_observations=mask_observations,
        loss_agg_mode="seq-mean-token-sum",
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_type="low_var_kl",
    )
    mask = loss_mask_for(RESPONSE_MASK, ATTENTION, cfg)
    rewards = torch.zeros(2, 8)
    rewards[0, 6], rewards[1, 5] = 1.0, 0.0
    adv = ADVANTAGES.get("grpo")(AdvantageInputs(rewards, mask, group_ids=["q", "q"]), cfg).advantages
    old = -torch.rand(2, 8, generator=gen)
    logprobs = (old + 0.1 * torch.randn(2, 8, generator=gen)).requires_grad_(True)
    ref = old - 0.05
    entropy = torch.rand(2, 8, generator=gen)
    loss, metrics = compute_actor_loss(logprobs, old, adv, mask, cfg, entropy=entropy, ref_logprobs=ref)
    assert {"actor/pg_loss", "actor/clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss"} <= set(metrics)
    loss.backward()
    assert logprobs.grad is not None
    return logprobs.grad


def test_masked_and_unmasked_losses_differ_exactly_where_mask_is_zero():
    # seq-mean-token-sum keeps each token's weight independent of how many tokens count, so the gradients of
    # the masked and the unmasked objective agree at model tokens and differ exactly at observation tokens
    # (padding has attention 0 and counts in neither).
    masked, unmasked = _actor_loss_grads(True), _actor_loss_grads(False)
    differs = masked != unmasked  # bit for bit where they agree: a model token's gradient is the same ops either way
    observation = (RESPONSE_MASK == 0) & (ATTENTION == 1)
    assert torch.equal(differs, observation)
    assert torch.all(masked[RESPONSE_MASK == 0] == 0)


def test_actor_loss_adds_entropy_and_kl_terms():
    # One token, ratio 1, A = 1: pg = -1. Entropy 2 with coeff 0.1 -> -0.2. k1 KL = 0.5 with coeff 0.2 -> +0.1.
    cfg = AlgorithmConfig(entropy_coeff=0.1, use_kl_loss=True, kl_loss_coef=0.2, kl_loss_type="k1")
    lp = torch.tensor([[-1.0]])
    loss, metrics = compute_actor_loss(
        lp, lp, torch.ones(1, 1), torch.ones(1, 1), cfg, entropy=torch.full((1, 1), 2.0), ref_logprobs=lp - 0.5
    )
    assert loss.item() == pytest.approx(-1.0 - 0.2 + 0.1)
    assert metrics["actor/loss"] == pytest.approx(-1.1)
    assert metrics["actor/kl_loss"] == pytest.approx(0.5)
    assert metrics["actor/entropy"] == pytest.approx(2.0)


def test_actor_loss_missing_inputs_are_clear_errors():
    lp, ones = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="no ref_logprobs"):
        compute_actor_loss(lp, lp, ones, ones, AlgorithmConfig(use_kl_loss=True))
    with pytest.raises(ValueError, match="no entropy"):
        compute_actor_loss(lp, lp, ones, ones, AlgorithmConfig(use_kl_loss=False, entropy_coeff=0.01))


def test_registries_unknown_names_and_import_strings():
    with pytest.raises(KeyError, match="unknown policy loss 'ppo'; registered: gspo, ppo_clip"):
        POLICY_LOSSES.get("ppo")
    with pytest.raises(KeyError, match="registered: k1, k2, k3, kl, low_var_kl, mse"):
        estimate_kl(torch.zeros(1), torch.zeros(1), "full")
    with pytest.raises(KeyError, match="loss aggregation mode 'mean'"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "mean")
    by_string = POLICY_LOSSES.get("search_rl.algorithms.losses:compute_ppo_clip_loss")
    assert by_string is POLICY_LOSSES.get("ppo_clip")


def test_entropy_and_kl_metrics_are_per_token_means_whatever_the_loss_aggregation():
    # Two sequences, 3 and 1 loss tokens, T = 4. Entropy per token 1, 2, 3 | 6: per-token mean 12 / 4 = 3. k1 KL is
    # logprobs - ref = 0.5 everywhere: mean 0.5. seq-mean-token-sum-norm aggregates (6 / 4 + 6 / 4) / 2 = 1.5 for the
    # entropy and (1.5 / 4 + 0.5 / 4) / 2 = 0.25 for the KL term the loss adds.
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    entropy = torch.tensor([[1.0, 2.0, 3.0, 9.0], [6.0, 9.0, 9.0, 9.0]])
    lp = torch.zeros(2, 4)
    cfg = AlgorithmConfig(
        loss_agg_mode="seq-mean-token-sum-norm",
        entropy_coeff=0.1,
        use_kl_loss=True,
        kl_loss_coef=1.0,
        kl_loss_type="k1",
    )
    loss, metrics = compute_actor_loss(lp, lp, torch.zeros(2, 4), mask, cfg, entropy=entropy, ref_logprobs=lp - 0.5)
    assert metrics["actor/entropy"] == pytest.approx(3.0)
    assert metrics["actor/kl"] == pytest.approx(0.5)
    assert metrics["actor/kl_loss"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(-0.1 * 1.5 + 0.25)  # advantages 0: only the entropy and KL terms
