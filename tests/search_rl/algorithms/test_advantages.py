"""Advantage estimators against hand-computed values; observation-skipping GAE; GRPO grouping by id.

Run: python -m pytest tests/search_rl/algorithms/test_advantages.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import FP32_EPS, reorder_tol

from search_rl.algorithms import ADVANTAGES, AdvantageInputs, compute_discounted_returns, compute_gae
from search_rl.algorithms.advantages import GROUP_STD_EPS, group_index, leave_one_out, normalize_by_group
from search_rl.algorithms.masked import masked_whiten
from search_rl.config import AlgorithmConfig


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_gae_hand_computed():
    # gamma = 0.9, lam = 0.8, gamma * lam = 0.72, V = [0.5, 0.6, 0.7], reward 1 on the last token
    # t2: delta = 1 - 0.7 = 0.3                         A2 = 0.3
    # t1: delta = 0 + 0.9 * 0.7 - 0.6 = 0.03             A1 = 0.03 + 0.72 * 0.3 = 0.246
    # t0: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04             A0 = 0.04 + 0.72 * 0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]
    adv, ret = compute_gae(_t([[0, 0, 1]]), _t([[0.5, 0.6, 0.7]]), torch.ones(1, 3), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, _t([[0.21712, 0.246, 0.3]]))
    torch.testing.assert_close(ret, _t([[0.71712, 0.846, 1.0]]))


def test_gae_jumps_over_observation_span_hand_computed():
    # Same model tokens as above with a 2-token observation (values 9, never read) between tokens 0 and 1,
    # and one padding token at the end: the model tokens get exactly the numbers of the test above.
    rewards = _t([[0, 0, 0, 0, 1, 0]])
    values = _t([[0.5, 9.0, 9.0, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1, 0, 0, 1, 1, 0]])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, _t([[0.21712, 0, 0, 0.246, 0.3, 0]]))
    torch.testing.assert_close(ret, _t([[0.71712, 0, 0, 0.846, 1.0, 0]]))


def test_gae_with_spans_equals_gae_with_spans_removed():
    gen = torch.Generator().manual_seed(0)
    b, t = 4, 16
    rewards = torch.randn(b, t, generator=gen)
    values = torch.randn(b, t, generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, 3:7] = 0  # one observation
    mask[1, 2:4] = 0  # two observations and trailing padding
    mask[1, 8:11] = 0
    mask[1, 14:] = 0
    mask[3, 5:6] = 0
    rewards = rewards * mask  # rewards only on model tokens here (folding is tested separately)
    adv, ret = compute_gae(rewards, values, mask, gamma=0.95, lam=0.9)
    for i in range(b):
        keep = mask[i].bool()
        adv_cut, ret_cut = compute_gae(
            rewards[i, keep][None], values[i, keep][None], torch.ones(1, int(keep.sum())), gamma=0.95, lam=0.9
        )
        torch.testing.assert_close(adv[i, keep], adv_cut[0])
        torch.testing.assert_close(ret[i, keep], ret_cut[0])
        assert torch.all(adv[i, ~keep] == 0) and torch.all(ret[i, ~keep] == 0)


def test_gae_credits_observation_reward_to_previous_model_token():
    # Reward 1 sits on a trailing observation token (e.g. a budget cut inside <information>): it counts as the
    # reward of the last model token, as if the observation were cut out. gamma = lam = 1, V = 0:
    # A = [1, 1, 0, 0].
    adv, _ = compute_gae(_t([[0, 0, 0, 1]]), torch.zeros(1, 4), torch.tensor([[1, 1, 0, 0]]), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, _t([[1, 1, 0, 0]]))


def test_gae_estimator_whitens_over_model_tokens_and_ignores_observation_values():
    rewards = _t([[0, 0, 0, 1, 0], [0, 0, 0, 0, 0.5]])
    values = _t([[0.1, 5.0, 0.2, 0.3, 0.0], [0.4, 0.1, 0.2, 0.3, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]])
    cfg = AlgorithmConfig(adv_estimator="gae", gamma=1.0, lam=0.95)
    out = ADVANTAGES.get("gae")(AdvantageInputs(rewards, mask, values=values), cfg)
    raw, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(out.advantages, masked_whiten(raw, mask))
    torch.testing.assert_close(out.returns, ret)
    model = mask.bool()
    # whitened in float32: the mean and variance sum 8 terms, each |z| <= (n - 1) / sqrt(n) < 2.5 (tests/numerics.py);
    # the variance's 1e-8 under the root moves the std by 5e-9 / var, far less
    n = int(model.sum())
    assert abs(out.advantages[model].mean().item()) <= reorder_tol(n) * 2.5
    assert abs(out.advantages[model].std().item() - 1.0) <= reorder_tol(n) * 2.5
    changed = values.clone()
    changed[0, 1] = -100.0  # an observation's value is never read
    again = ADVANTAGES.get("gae")(AdvantageInputs(rewards, mask, values=changed), cfg)
    torch.testing.assert_close(again.advantages, out.advantages)


def test_discounted_returns_hand_computed():
    # gamma = 0.5 over model tokens only; the observation at index 1 is not a step:
    # G3 = 1, G2 = 0.5, G0 = 0.25
    returns = compute_discounted_returns(_t([[0, 0, 0, 1]]), torch.tensor([[1, 0, 1, 1]]), gamma=0.5)
    torch.testing.assert_close(returns, _t([[0.25, 0, 0.5, 1]]))


# Interleaved groups: a = samples 0, 2, 4 with scores 1, 0, 1; b = samples 1, 3 with 0, 1; c = sample 5 alone.
IDS = ["a", "b", "a", "b", "a", "c"]
SCORES = [1.0, 0.0, 0.0, 1.0, 1.0, 0.3]
# a: mean 2/3, deviations (1/3, -2/3, 1/3), unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3, std 0.57735
#    -> (0.57735, -1.15470, 0.57735)
# b: mean 1/2, unbiased var (1/4 + 1/4) / 1 = 1/2, std 0.70711 -> (-0.70711, 0.70711)
# c: a group of one -> 0
GRPO_EXPECTED = [3**-0.5, -(2**-0.5), -2 * 3**-0.5, 2**-0.5, 3**-0.5, 0.0]
GRPO_ATOL = 1.2 * GROUP_STD_EPS / 3**-0.5 + 8 * FP32_EPS
"""``(s - mean) / (std + GROUP_STD_EPS)`` is below ``(s - mean) / std`` by ``|a| * eps / std`` (|a| <= 1.16, std >=
0.577 here), plus a few float32 roundings of values below 2."""
DR_GRPO_EXPECTED = [1 / 3, -0.5, -2 / 3, 0.5, 1 / 3, 0.0]


def _outcome_inputs(scores: list[float], group_ids, width: int = 4) -> AdvantageInputs:
    """Outcome reward on the last model token; an observation at column 1 and padding in the last row."""
    b = len(scores)
    mask = torch.ones(b, width, dtype=torch.long)
    mask[:, 1] = 0
    mask[-1, -1] = 0
    rewards = torch.zeros(b, width)
    for i, s in enumerate(scores):
        rewards[i, int(mask[i].nonzero().max())] = s
    return AdvantageInputs(rewards, mask, group_ids=group_ids)


def test_grpo_groups_by_id_across_interleaved_order():
    cfg = AlgorithmConfig(adv_estimator="grpo")
    out = ADVANTAGES.get("grpo")(_outcome_inputs(SCORES, IDS), cfg)
    expected = torch.tensor(GRPO_EXPECTED)
    mask = _outcome_inputs(SCORES, IDS).response_mask
    torch.testing.assert_close(out.advantages, expected[:, None] * mask, atol=GRPO_ATOL, rtol=0)
    # returns: the outcome reward on every model token
    torch.testing.assert_close(out.returns, torch.tensor(SCORES)[:, None] * mask)


def test_grpo_tensor_ids_and_permutation_agree():
    perm = [5, 2, 0, 3, 1, 4]
    as_ints = torch.tensor([{"a": 10, "b": 3, "c": 7}[i] for i in IDS])
    scores = torch.tensor(SCORES)
    base = normalize_by_group(scores, IDS)
    torch.testing.assert_close(normalize_by_group(scores, as_ints), base)
    torch.testing.assert_close(normalize_by_group(scores[perm], [IDS[i] for i in perm]), base[perm])


def test_dr_grpo_only_centres():
    cfg = AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std=False)
    out = ADVANTAGES.get("grpo")(_outcome_inputs(SCORES, IDS), cfg)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor(DR_GRPO_EXPECTED))


def test_grpo_equal_scores_give_zero_not_nan():
    adv = normalize_by_group(torch.tensor([1.0, 1.0, 1.0]), ["q", "q", "q"])
    torch.testing.assert_close(adv, torch.zeros(3))


# Equal non-dyadic scores: in float32 the mean of 16 x 2.2 is off by ~1e-7 (summation rounding), and dividing that
# residue by std + 1e-6 gave every sample an advantage of up to ~0.2. F1 partial credit produces such values.
EQUAL_GROUPS = [
    [2.2] * 16,
    [0.2857142857142857] * 16,  # an F1 of 2/7
    [1.0 + 0.5 * 0.6666666666666666] * 5,  # EM 0 + F1 weight 0.5 x 2/3, an odd group size
    [0.1] * 3 + [0.7] * 3,  # two groups side by side, one of each value
]


@pytest.mark.parametrize("scores", EQUAL_GROUPS, ids=["2.2x16", "f1-2/7x16", "shaped-x5", "0.1+0.7"])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_equal_scores_give_exactly_zero(scores: list[float], name: str):
    ids = ["q"] * len(scores) if len(set(scores)) == 1 else ["a"] * 3 + ["b"] * 3
    values = torch.tensor(scores)
    grpo = name == "grpo"
    adv = leave_one_out(values, ids) if name == "rloo" else normalize_by_group(values, ids, norm_by_std=grpo)
    assert torch.equal(adv, torch.zeros(len(scores))), adv


def test_equal_scores_in_a_mixed_batch_do_not_disturb_other_groups():
    scores = torch.tensor([2.2] * 16 + [1.0, 0.0, 0.0, 1.0])
    ids = ["flat"] * 16 + ["g"] * 4
    adv = normalize_by_group(scores, ids)
    assert torch.equal(adv[:16], torch.zeros(16))
    # g: mean 1/2, unbiased std sqrt(1/3) -> +-0.5 / (0.57735 + 1e-6)
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (3**-0.5 + GROUP_STD_EPS)
    torch.testing.assert_close(adv[16:], expected, atol=4 * FP32_EPS, rtol=0)


def test_rloo_hand_computed():
    # group g: scores (1, 0, 0, 1); for a 1 the others average 1/3 -> 2/3, for a 0 they average 2/3 -> -2/3
    # group h alone -> 0
    cfg = AlgorithmConfig(adv_estimator="rloo")
    out = ADVANTAGES.get("rloo")(_outcome_inputs([1, 0, 0, 1, 5], ["g", "g", "g", "g", "h"]), cfg)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0]))
    torch.testing.assert_close(leave_one_out(torch.tensor([3.0, 1.0]), [0, 0]), torch.tensor([2.0, -2.0]))


def test_reinforce_plus_plus_hand_computed():
    # gamma = 0.5. Row 0: observation at column 1 -> G = (0.5, 0, 1) on model tokens 0 and 2.
    # Row 1: padding at column 2 -> G = (0.5, 1, 0).
    # Model-token returns (0.5, 1, 0.5, 1): mean 0.75, deviations (-0.25, 0.25, -0.25, 0.25),
    # unbiased var 4 * 0.0625 / 3 = 1/12, std 0.288675 -> advantages -+0.866025
    rewards = _t([[0, 0, 1], [0, 1, 0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    cfg = AlgorithmConfig(adv_estimator="reinforce_plus_plus", gamma=0.5)
    out = ADVANTAGES.get("reinforce_plus_plus")(AdvantageInputs(rewards, mask), cfg)
    torch.testing.assert_close(out.returns, _t([[0.5, 0, 1], [0.5, 1, 0]]))
    a = 0.75**0.5
    torch.testing.assert_close(out.advantages, _t([[-a, 0, a], [-a, a, 0]]))


def test_remax_hand_computed():
    # Undiscounted reward-to-go minus the greedy rollout's reward: row 0 1 - 0.25 = 0.75 on model tokens;
    # row 1 0 - 1 = -1.
    rewards = _t([[0, 0, 1], [0, 0, 0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    cfg = AlgorithmConfig(adv_estimator="remax")
    out = ADVANTAGES.get("remax")(AdvantageInputs(rewards, mask, baseline_rewards=torch.tensor([0.25, 1.0])), cfg)
    torch.testing.assert_close(out.advantages, _t([[0.75, 0, 0.75], [-1, -1, 0]]))
    torch.testing.assert_close(out.returns, _t([[1, 0, 1], [0, 0, 0]]))


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "reinforce_plus_plus", "remax"])
def test_every_estimator_is_zero_where_mask_is_zero(name: str):
    gen = torch.Generator().manual_seed(1)
    b, t = 6, 10
    mask = (torch.rand(b, t, generator=gen) > 0.3).long()
    inputs = AdvantageInputs(
        token_level_rewards=torch.randn(b, t, generator=gen),
        response_mask=mask,
        values=torch.randn(b, t, generator=gen),
        group_ids=["p0", "p1", "p0", "p1", "p0", "p1"],
        baseline_rewards=torch.randn(b, generator=gen),
    )
    out = ADVANTAGES.get(name)(inputs, AlgorithmConfig(adv_estimator=name))
    assert out.advantages.shape == out.returns.shape == (b, t)
    assert torch.all(out.advantages[mask == 0] == 0) and torch.all(out.returns[mask == 0] == 0)
    assert torch.isfinite(out.advantages).all()


def test_missing_inputs_are_clear_errors():
    rewards, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="needs AdvantageInputs.values"):
        ADVANTAGES.get("gae")(AdvantageInputs(rewards, mask), AlgorithmConfig())
    with pytest.raises(ValueError, match="needs AdvantageInputs.group_ids"):
        ADVANTAGES.get("grpo")(AdvantageInputs(rewards, mask), AlgorithmConfig(adv_estimator="grpo"))
    with pytest.raises(ValueError, match="needs AdvantageInputs.baseline_rewards"):
        ADVANTAGES.get("remax")(AdvantageInputs(rewards, mask), AlgorithmConfig(adv_estimator="remax"))
    with pytest.raises(ValueError, match="group_ids has 1 entries for 2 samples"):
        AdvantageInputs(rewards, mask, group_ids=["a"])
    with pytest.raises(ValueError, match="response_mask shape"):
        AdvantageInputs(rewards, torch.ones(2, 4))


def test_registry_unknown_name_lists_estimators():
    with pytest.raises(KeyError, match="registered: gae, grpo, reinforce_plus_plus, remax, rloo"):
        ADVANTAGES.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGES.register("grpo")(lambda inputs, cfg: None)


def test_group_index_dense_indices():
    index, n = group_index(torch.tensor([7, 3, 7, 9]))
    assert n == 3 and index[0] == index[2] and len(set(index.tolist())) == 3
