"""Advantage estimators: token-level rewards (plus values, groups or baselines) -> advantages and returns.

Each estimator is registered in ``ADVANTAGES`` under the name ``algorithm.adv_estimator`` takes, with one
signature, ``(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs``; the trainer calls
``ADVANTAGES.get(cfg.adv_estimator)(inputs, cfg)`` and never branches on the name. What an estimator needs from
the run (a critic, groups of samples, a greedy baseline) is declared on it with ``@requires(...)``; the config
reads it with ``estimator_needs(name)`` and keeps no lists of estimator names.

Observation tokens are not time steps. A search response interleaves model tokens (``response_mask == 1``) with
inserted ``<information>`` tokens (mask 0). The policy acted only at model tokens, so every recursion over time
here (GAE, discounted returns) links each model token to the next *model* token, jumping over mask-0 spans:
no discount, no value and no TD error is taken at an observation token. A reward placed on a mask-0 token is
credited to the last model token before it (the action that led to it); a reward before the first model token is
dropped. Advantages and returns are 0 wherever ``response_mask`` is 0. Search-R1 (verl 0.1) runs GAE over every
response token instead, so its critic must predict values at retrieved text and its TD errors cross observations.

To reproduce Search-R1's ablation without observation masking, pass the attention-only mask from
``loss_mask_for`` as ``response_mask``: then observation tokens count as steps like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from search_rl.algorithms.masked import masked_whiten
from search_rl.config import AlgorithmConfig
from search_rl.registry import Registry

F = TypeVar("F", bound=Callable[..., object])

GroupIds = Sequence[str] | Sequence[int] | torch.Tensor
"""Per-sample group keys: samples of the same prompt share a key (a globally unique prompt id)."""

GROUP_STD_EPS = 1e-6
"""Added to a group's standard deviation before dividing (GRPO)."""


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read. Each estimator states which optional field it needs and raises without it.

    Fields:
        token_level_rewards: (B, T) float — reward per response token (an outcome reward sits on the last model
            token; the KL penalty, when in the reward, on every model token).
        response_mask: (B, T) — 1 = model-generated token, 0 = inserted observation token or padding.
        values: (B, T) float critic values, or None (``gae`` needs them; read at model tokens only).
        group_ids: (B,) group keys (list of str/int or a tensor), or None (``grpo`` and ``rloo`` need them).
        baseline_rewards: (B,) float total reward of each prompt's greedy response, or None (``remax`` needs it).
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    values: torch.Tensor | None = None
    group_ids: GroupIds | None = None
    baseline_rewards: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.token_level_rewards.shape)
        if len(shape) != 2:
            raise ValueError(f"AdvantageInputs.token_level_rewards must be (B, T), got shape {shape}")
        if tuple(self.response_mask.shape) != shape:
            raise ValueError(f"AdvantageInputs.response_mask shape {tuple(self.response_mask.shape)} != {shape}")
        if self.values is not None and tuple(self.values.shape) != shape:
            raise ValueError(f"AdvantageInputs.values shape {tuple(self.values.shape)} != {shape}")
        if self.group_ids is not None and len(self.group_ids) != shape[0]:
            raise ValueError(f"AdvantageInputs.group_ids has {len(self.group_ids)} entries for {shape[0]} samples")
        if self.baseline_rewards is not None and tuple(self.baseline_rewards.shape) != shape[:1]:
            raise ValueError(
                f"AdvantageInputs.baseline_rewards shape {tuple(self.baseline_rewards.shape)} != ({shape[0]},)"
            )


@dataclass(frozen=True)
class AdvantageOutputs:
    """What an estimator returns.

    Fields:
        advantages: (B, T) float, 0 where ``response_mask`` is 0.
        returns: (B, T) float, 0 where ``response_mask`` is 0 — the critic's target for ``gae``
            (advantage + value), the reward-to-go over model tokens for the critic-free estimators.
    """

    advantages: torch.Tensor
    returns: torch.Tensor


AdvantageFn = Callable[[AdvantageInputs, "AlgorithmConfig"], AdvantageOutputs]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
"""Advantage estimators by ``algorithm.adv_estimator`` name."""


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an advantage estimator needs from the run besides rewards (declared with ``requires``)."""

    critic: bool = False
    """Reads ``AdvantageInputs.values``: the run needs a critic (``critic.enable: null`` turns it on)."""
    groups: bool = False
    """Compares the samples of one prompt (``AdvantageInputs.group_ids``): ``rollout.n`` must be >= 2."""
    greedy_baseline: bool = False
    """Reads ``AdvantageInputs.baseline_rewards``: the reward of one greedy rollout of each prompt."""


_NEEDS_ATTR = "estimator_needs"


def requires(*, critic: bool = False, groups: bool = False, greedy_baseline: bool = False) -> Callable[[F], F]:
    """Declare what an estimator needs (``EstimatorNeeds``); works on an estimator reached by import string too.

    >>> @requires(groups=True)
    ... def my_estimator(inputs, cfg): ...
    >>> my_estimator.estimator_needs
    EstimatorNeeds(critic=False, groups=True, greedy_baseline=False)
    """

    def mark(fn: F) -> F:
        setattr(fn, _NEEDS_ATTR, EstimatorNeeds(critic=critic, groups=groups, greedy_baseline=greedy_baseline))
        return fn

    return mark


def estimator_needs(name: str) -> EstimatorNeeds:
    """What the estimator ``name`` (a registry name or import string) needs; nothing extra when it declares nothing.

    >>> estimator_needs("gae").critic, estimator_needs("grpo").groups, estimator_needs("reinforce_plus_plus")
    (True, True, EstimatorNeeds(critic=False, groups=False, greedy_baseline=False))
    """
    needs = getattr(ADVANTAGES.get(name), _NEEDS_ATTR, None)
    return needs if isinstance(needs, EstimatorNeeds) else EstimatorNeeds()


def compute_gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over model tokens only (https://arxiv.org/abs/1506.02438).

    With ``k`` indexing the model tokens of a row in order, ``r_k`` their rewards (plus any reward on the mask-0
    tokens up to the next model token) and ``V_{n+1} = 0`` after the last one::

        delta_k = r_k + gamma * V_{k+1} - V_k
        A_k     = delta_k + gamma * lam * A_{k+1}
        R_k     = A_k + V_k

    which equals GAE on the row with its mask-0 spans cut out. Nothing is whitened here.

    Args:
        token_level_rewards: (B, T) rewards.
        values: (B, T) critic values (ignored where the mask is 0).
        response_mask: (B, T) 1 = model token (a time step), 0 = observation or padding (skipped).
        gamma: discount per model token.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, both (B, T) and 0 where the mask is 0.

    >>> adv, ret = compute_gae(torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.25]]),
    ...                        torch.tensor([[1, 0, 1]]), gamma=1.0, lam=1.0)
    >>> adv  # token 2: 1 - 0.25; token 0: (0 + 5, the observation's reward) + V_2 - V_0 + A_2 = 5 + 0.25 - 0.5 + 0.75
    tensor([[5.5000, 0.0000, 0.7500]])
    """
    mask = response_mask.bool()  # (B, T)
    rewards = token_level_rewards.to(values.dtype)  # (B, T)
    advantages = torch.zeros_like(values)  # (B, T)
    zeros = torch.zeros_like(values[:, 0])  # (B,)
    next_value, next_adv, pending_reward = zeros, zeros, zeros  # (B,) each, state of the next model token
    for t in reversed(range(values.shape[1])):
        is_step = mask[:, t]  # (B,)
        pending_reward = pending_reward + rewards[:, t]
        delta = pending_reward + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(is_step, adv, zeros)
        # At a mask-0 token the state passes through unchanged: the recursion jumps over it.
        next_value = torch.where(is_step, values[:, t], next_value)
        next_adv = torch.where(is_step, adv, next_adv)
        pending_reward = torch.where(is_step, zeros, pending_reward)
    returns = (advantages + values) * mask.to(values.dtype)  # (B, T)
    return advantages, returns


def compute_discounted_returns(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Reward-to-go ``G_k = r_k + gamma * G_{k+1}`` over model tokens only, 0 where the mask is 0.

    Mask-0 spans are skipped as in ``compute_gae`` (this is GAE with zero values and lambda 1).

    >>> compute_discounted_returns(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[1, 0, 1, 1]]), gamma=0.5)
    tensor([[0.2500, 0.0000, 0.5000, 1.0000]])
    """
    values = torch.zeros_like(token_level_rewards, dtype=torch.float32)  # (B, T)
    returns, _ = compute_gae(token_level_rewards, values, response_mask, gamma=gamma, lam=1.0)
    return returns


def group_index(group_ids: GroupIds) -> tuple[torch.Tensor, int]:
    """Map group keys to dense indices ``0..G-1``; samples of a group need not be adjacent.

    >>> group_index(["b", "a", "b"])
    (tensor([0, 1, 0]), 2)
    """
    if isinstance(group_ids, torch.Tensor):
        unique, index = torch.unique(group_ids.reshape(-1), return_inverse=True)
        return index, int(unique.numel())
    dense: dict[str | int, int] = {}
    index_list = [dense.setdefault(key, len(dense)) for key in group_ids]
    return torch.tensor(index_list, dtype=torch.long), len(dense)


def _group_stats(scores: torch.Tensor, group_ids: GroupIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group size, group mean and unbiased group std, each (B,), in float64.

    float64 because a group whose samples all scored the same non-dyadic value (16 x 2.2) must centre to exactly 0:
    a float32 mean leaves a residue of ~1e-8 that ``std + 1e-6`` would blow up to an advantage of ~0.01-0.2. Summing
    n equal float32 values in float64 is exact (24 + log2(n) bits), and so is dividing the sum by n.
    """
    index, n_groups = group_index(group_ids)
    index = index.to(scores.device)  # (B,)
    scores = scores.to(torch.float64)  # (B,)
    count = torch.zeros(n_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, index, torch.ones_like(scores)
    )  # (G,)
    mean = torch.zeros_like(count).index_add_(0, index, scores) / count  # (G,)
    sq_dev = (scores - mean[index]) ** 2  # (B,)
    var = torch.zeros_like(count).index_add_(0, index, sq_dev) / (count - 1).clamp(min=1.0)  # (G,)
    return count[index], mean[index], var.sqrt()[index]


def _all_equal(scores: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """Per sample (B,) bool: every sample of its group has exactly the same score (no signal to learn from)."""
    index, n_groups = group_index(group_ids)
    index = index.to(scores.device)  # (B,)
    lowest = torch.full((n_groups,), math.inf, dtype=scores.dtype, device=scores.device)
    highest = torch.full((n_groups,), -math.inf, dtype=scores.dtype, device=scores.device)
    lowest = lowest.scatter_reduce(0, index, scores, reduce="amin")  # (G,)
    highest = highest.scatter_reduce(0, index, scores, reduce="amax")  # (G,)
    return (lowest == highest)[index]


def normalize_by_group(scores: torch.Tensor, group_ids: GroupIds, norm_by_std: bool = True) -> torch.Tensor:
    """GRPO's outcome advantage: ``(s - mean_group) / (std_group + 1e-6)``, or only centred when not
    ``norm_by_std`` (Dr.GRPO). The std is unbiased (Bessel); a group of one sample, or one whose scores are all
    equal, gets exactly 0.

    >>> normalize_by_group(torch.tensor([1.0, 0.0, 5.0, 0.0]), ["q1", "q1", "q2", "q1"], norm_by_std=False)
    tensor([ 0.6667, -0.3333,  0.0000, -0.3333])
    """
    scores = scores.to(torch.float32)  # (B,)
    count, mean, std = _group_stats(scores, group_ids)  # (B,) each, float64
    centred = scores.double() - mean
    advantages = (centred / (std + GROUP_STD_EPS) if norm_by_std else centred).to(torch.float32)
    flat = (count <= 1) | _all_equal(scores, group_ids)
    return torch.where(flat, torch.zeros_like(advantages), advantages)


def leave_one_out(scores: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """RLOO's advantage: ``s_i - mean_{j != i in group} s_j = n / (n - 1) * (s_i - mean_group)``; 0 for a group of one
    or of equal scores.

    >>> leave_one_out(torch.tensor([1.0, 0.0, 0.0]), [7, 7, 7])
    tensor([ 1.0000, -0.5000, -0.5000])
    """
    scores = scores.to(torch.float32)  # (B,)
    count, mean, _ = _group_stats(scores, group_ids)  # (B,) each, float64
    advantages = (count / (count - 1).clamp(min=1.0) * (scores.double() - mean)).to(torch.float32)
    flat = (count <= 1) | _all_equal(scores, group_ids)
    return torch.where(flat, torch.zeros_like(advantages), advantages)


def _require_groups(inputs: AdvantageInputs, name: str) -> GroupIds:
    if inputs.group_ids is None:
        raise ValueError(
            f"adv_estimator {name!r} needs AdvantageInputs.group_ids (one key per sample, shared by the samples of "
            "one prompt); pass the batch's prompt ids"
        )
    return inputs.group_ids


def _broadcast_outcome(advantages: torch.Tensor, inputs: AdvantageInputs) -> AdvantageOutputs:
    """Spread per-sample advantages (B,) over model tokens; returns = undiscounted reward-to-go."""
    mask = inputs.response_mask.to(torch.float32)  # (B, T)
    returns = compute_discounted_returns(inputs.token_level_rewards, inputs.response_mask, gamma=1.0)  # (B, T)
    return AdvantageOutputs(advantages=advantages.unsqueeze(-1) * mask, returns=returns)


@ADVANTAGES.register("gae")
@requires(critic=True)
def compute_gae_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """PPO with a critic: observation-skipping GAE (``compute_gae``), advantages whitened over model tokens of the
    batch (as verl does). Needs ``inputs.values``. https://arxiv.org/abs/1506.02438
    """
    if inputs.values is None:
        raise ValueError(
            "adv_estimator 'gae' needs AdvantageInputs.values from a critic; compute them with the critic worker, "
            "or choose a critic-free estimator (grpo, rloo, reinforce_plus_plus, remax)"
        )
    advantages, returns = compute_gae(
        inputs.token_level_rewards, inputs.values.to(torch.float32), inputs.response_mask, cfg.gamma, cfg.lam
    )
    return AdvantageOutputs(advantages=masked_whiten(advantages, inputs.response_mask), returns=returns)


@ADVANTAGES.register("grpo")
@requires(groups=True)
def compute_grpo_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """GRPO (https://arxiv.org/abs/2402.03300): each sample's total reward, normalised within its group (the
    samples of one prompt), on every model token. ``cfg.norm_adv_by_std=False`` gives Dr.GRPO
    (https://arxiv.org/abs/2503.20783). Needs ``inputs.group_ids``.
    """
    scores = inputs.token_level_rewards.sum(-1)  # (B,)
    groups = _require_groups(inputs, "grpo")
    return _broadcast_outcome(normalize_by_group(scores, groups, cfg.norm_adv_by_std), inputs)


@ADVANTAGES.register("rloo")
@requires(groups=True)
def compute_rloo_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """RLOO (https://arxiv.org/abs/2402.14740): each sample's total reward minus the mean of the other samples of
    its group, on every model token. Needs ``inputs.group_ids``.
    """
    scores = inputs.token_level_rewards.sum(-1)  # (B,)
    return _broadcast_outcome(leave_one_out(scores, _require_groups(inputs, "rloo")), inputs)


@ADVANTAGES.register("reinforce_plus_plus")
def compute_reinforce_plus_plus_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """REINFORCE++ (https://arxiv.org/abs/2501.03262): discounted reward-to-go over model tokens, whitened over the
    model tokens of the whole batch (no critic, no groups).
    """
    returns = compute_discounted_returns(inputs.token_level_rewards, inputs.response_mask, cfg.gamma)  # (B, T)
    return AdvantageOutputs(advantages=masked_whiten(returns, inputs.response_mask), returns=returns)


@ADVANTAGES.register("remax")
@requires(greedy_baseline=True)
def compute_remax_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """ReMax (https://arxiv.org/abs/2310.10505): undiscounted reward-to-go minus the total reward of the same
    prompt's greedy response. Needs ``inputs.baseline_rewards``.
    """
    if inputs.baseline_rewards is None:
        raise ValueError(
            "adv_estimator 'remax' needs AdvantageInputs.baseline_rewards: the reward of one greedy rollout per "
            "sample's prompt, shape (B,)"
        )
    mask = inputs.response_mask.to(torch.float32)  # (B, T)
    returns = compute_discounted_returns(inputs.token_level_rewards, inputs.response_mask, gamma=1.0)  # (B, T)
    advantages = (returns - inputs.baseline_rewards.to(torch.float32).unsqueeze(-1)) * mask  # (B, T)
    return AdvantageOutputs(advantages=advantages, returns=returns)
