"""KL penalty in the reward: fixed and adaptive coefficient controllers, and ``apply_kl_penalty``.

Used when ``algorithm.use_kl_in_reward`` is true (classic RLHF PPO). The adaptive controller of Ziegler et al.
2019 (https://arxiv.org/abs/1909.08593) moves the coefficient so that the measured KL per model token tracks
``algorithm.kl_target``. Controllers carry state across steps: checkpoint it with ``state_dict``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from search_rl.algorithms.losses import estimate_kl
from search_rl.algorithms.masked import masked_mean
from search_rl.config import AlgorithmConfig

ADAPTIVE_KL_MAX_ERROR = 0.2
"""The adaptive controller clips its proportional error to +-20% (Ziegler et al. 2019)."""


class KLController(Protocol):
    """A KL coefficient that may be updated once per step from the measured KL."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after a batch of ``n_steps`` samples whose mean KL per model token was ``current_kl``."""
        ...

    def state_dict(self) -> dict[str, float]:
        """What a checkpoint must hold to resume the controller."""
        ...

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore from ``state_dict()``."""
        ...


class FixedKLController:
    """A constant coefficient.

    >>> ctrl = FixedKLController(0.05)
    >>> ctrl.update(current_kl=3.0, n_steps=8)
    >>> ctrl.value
    0.05
    """

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Ziegler et al. 2019's proportional controller (https://arxiv.org/abs/1909.08593)::

        error = clip(current_kl / target_kl - 1, -0.2, 0.2)
        value = value * (1 + error * n_steps / horizon)

    >>> ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    >>> ctrl.update(current_kl=1.5, n_steps=50)  # error clipped to 0.2: 0.1 * (1 + 0.2 * 0.5)
    >>> round(ctrl.value, 6)
    0.11

    Args:
        init_kl_coef: starting coefficient.
        target_kl: target KL per model token, in nats.
        horizon: samples over which a persistent error changes the coefficient by about ``e^0.2``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon < 1:
            raise ValueError(f"AdaptiveKLController needs target_kl > 0 and horizon >= 1, got {target_kl}, {horizon}")
        self.value = init_kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target_kl - 1.0, -ADAPTIVE_KL_MAX_ERROR), ADAPTIVE_KL_MAX_ERROR)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


def build_kl_controller(cfg: AlgorithmConfig) -> KLController:
    """The controller ``cfg.kl_ctrl_type`` names, starting at ``cfg.kl_coef``.

    >>> from search_rl.config import AlgorithmConfig
    >>> type(build_kl_controller(AlgorithmConfig(kl_ctrl_type="adaptive"))).__name__
    'AdaptiveKLController'
    """
    if cfg.kl_ctrl_type == "adaptive":
        return AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    if cfg.kl_ctrl_type == "fixed":
        return FixedKLController(cfg.kl_coef)
    raise ValueError(f"algorithm.kl_ctrl_type must be 'fixed' or 'adaptive', got {cfg.kl_ctrl_type!r}")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_estimator: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract ``kl_ctrl.value * KL`` from the scores at the tokens ``mask`` selects, then update the controller.

    Call it once per training step: it feeds the batch's KL to ``kl_ctrl.update`` (with ``n_steps`` = batch size).

    Args:
        token_level_scores: (B, T) task rewards per token.
        logprobs: (B, T) log-probs of the taken tokens under the sampling (old) policy.
        ref_logprobs: (B, T) the same under the reference policy.
        mask: (B, T) tokens that count (``loss_mask_for``): observations and padding get no penalty.
        kl_ctrl: the coefficient controller (updated in place).
        kl_estimator: a ``KL_ESTIMATORS`` name, normally ``cfg.kl_reward_type``.

    Returns:
        ``(token_level_rewards, metrics)``; metrics ``actor/reward_kl_penalty`` (mean over samples of the mean KL
        per model token) and ``actor/reward_kl_penalty_coeff`` (the coefficient used, before the update).

    >>> rewards, m = apply_kl_penalty(torch.tensor([[0.0, 1.0]]), torch.tensor([[-1.0, -1.0]]),
    ...                               torch.tensor([[-2.0, -1.5]]), torch.tensor([[1, 1]]),
    ...                               FixedKLController(0.1), "k1")
    >>> rewards  # k1 = [1.0, 0.5]
    tensor([[-0.1000,  0.9500]])
    """
    beta = kl_ctrl.value
    kl = estimate_kl(logprobs, ref_logprobs, kl_estimator) * mask.to(logprobs.dtype)  # (B, T)
    token_level_rewards = token_level_scores - beta * kl  # (B, T)
    current_kl = masked_mean(kl, mask, dim=-1).mean().item()  # mean over samples of KL per model token
    kl_ctrl.update(current_kl=current_kl, n_steps=int(token_level_scores.shape[0]))
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics
