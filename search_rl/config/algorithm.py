"""``AlgorithmConfig``: every knob of the RL objective (advantage estimator, PPO clipping, KL, entropy, aggregation).

It is the ``algorithm`` Hydra group. The advantage estimators, losses and KL controllers of ``search_rl.algorithms``
take it whole, so the trainer hands one object around and never branches on estimator or loss names."""

from __future__ import annotations

from dataclasses import dataclass, field

KL_CTRL_TYPES = ("fixed", "adaptive")
"""Valid ``kl_ctrl_type`` values."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (https://arxiv.org/abs/2503.14476): train only on groups whose rewards differ, and
    roll out further prompts to fill the batch (``search_rl/trainer/dynamic_sampling.py``, ``docs/algorithms.md``)."""

    enable: bool = False
    """Drop the groups (the ``rollout.n`` samples of a prompt) whose ``metric`` is equal on every sample, and roll
    out further batches of prompts until ``data.train_batch_size`` groups with a spread are kept."""
    metric: str = "score"
    """What must differ within a group: ``score`` (the shaped reward the advantages use) or a component of the
    reward (``em``, ``f1``, ``subem``, ``format``, ...; DAPO filters on accuracy, ``em`` here)."""
    max_num_gen_batches: int = 10
    """Most generation batches (of ``data.train_batch_size`` prompts each) per step. When they are spent the step
    trains on the groups kept so far (logged as ``dynamic_sampling/cap_hit``); never unlimited, so a policy that
    solves (or fails) every prompt cannot loop for ever."""

    def __post_init__(self) -> None:
        if self.max_num_gen_batches < 1:
            raise ValueError(
                f"algorithm.filter_groups.max_num_gen_batches must be >= 1, got {self.max_num_gen_batches}; "
                "unlike verl, 0 (no limit) is refused: a step could roll out for ever once every group is flat"
            )
        if not self.metric:
            raise ValueError("algorithm.filter_groups.metric is empty; use score or a reward component such as em")


@dataclass
class AlgorithmConfig:
    """The RL algorithm: which advantage estimator, which policy loss, and their coefficients.

    Not a frozen dataclass on purpose: OmegaConf marks frozen dataclasses read-only, which breaks Hydra
    command-line overrides such as ``algorithm.adv_estimator=grpo``. Treat instances as read-only anyway.

    >>> AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std=False).clip_ratio_high
    0.2
    """

    adv_estimator: str = "gae"
    """Advantage estimator, a name in ``ADVANTAGES`` (``gae``, ``grpo``, ``rloo``, ``reinforce_plus_plus``,
    ``remax``) or an import string ``"pkg.module:function"``. ``gae`` needs a critic."""
    gamma: float = 1.0
    """Discount per model token (observation tokens are not time steps and are never discounted over)."""
    lam: float = 1.0
    """GAE lambda: 1.0 = Monte-Carlo returns minus values, 0.0 = one-step TD errors."""
    norm_adv_by_std: bool = True
    """GRPO: divide the group-centred reward by the group's standard deviation. False = Dr.GRPO
    (https://arxiv.org/abs/2503.20783), which only centres."""
    clip_ratio_low: float = 0.2
    """PPO clip range below 1: the ratio is clipped to ``1 - clip_ratio_low``."""
    clip_ratio_high: float = 0.2
    """PPO clip range above 1: the ratio is clipped to ``1 + clip_ratio_high`` (DAPO "clip-higher" uses 0.28)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound (https://arxiv.org/abs/1912.09729): for negative advantages the per-token loss is at most
    ``-A * clip_ratio_c``. Must be > 1."""
    value_clip: float = 0.5
    """Clip range of the value prediction around the old value, in reward units (PPO value clipping)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus subtracted from the actor loss (0 = off). The ``ppo`` and ``grpo`` presets set
    Search-R1's 0.001."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_coef * KL(policy || reference)`` from the token-level rewards before advantages."""
    kl_coef: float = 0.001
    """Initial KL-in-reward coefficient (constant when ``kl_ctrl_type`` is ``fixed``)."""
    kl_reward_type: str = "k1"
    """KL estimator used in the reward, a name in ``KL_ESTIMATORS`` (``k1``, ``k2``, ``low_var_kl``)."""
    kl_ctrl_type: str = "fixed"
    """KL-in-reward controller: ``fixed`` or ``adaptive`` (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593)."""
    kl_target: float = 0.1
    """Adaptive controller: target KL per model token, in nats."""
    kl_horizon: int = 10000
    """Adaptive controller: horizon in samples; the coefficient moves by at most ``20% * n_samples / horizon``
    per update."""
    use_kl_loss: bool = True
    """Add ``kl_loss_coef * KL(policy || reference)`` to the actor loss (GRPO style; Search-R1's default)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the KL loss, a name in ``KL_ESTIMATORS`` (``k1``, ``k2``, ``low_var_kl``)."""
    loss_agg_mode: str = "token-mean"
    """How a (B, T) per-token loss becomes a scalar: ``token-mean``, ``seq-mean-token-sum``,
    ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (see ``aggregate_loss``)."""
    mask_observations: bool = True
    """Exclude inserted ``<information>`` tokens from every loss, KL, entropy and advantage term. False is the
    ablation of Search-R1 without retrieved-token masking: the mask becomes the attention mask."""
    tis_cap: float | None = None
    """Truncated importance sampling over the rollout/trainer mismatch: each token's advantage is scaled by
    ``min(exp(old_logprobs - rollout_logprobs), tis_cap)`` (0 = off). Use it when the engine's log-probs differ from
    the trainer's (vLLM in bf16) or come from older weights (asynchronous training). ``null`` = 2.0 where the
    sampler is not the trainer: samples of older weights (``trainer.mode=one_step_off``, or ``async`` with
    ``max_staleness > 0``) or an engine that computes differently (vLLM, bf16); off for the HF engine in float32."""
    policy_loss: str = "ppo_clip"
    """Policy loss, a name in ``POLICY_LOSSES`` (``ppo_clip``, ``gspo``) or an import string
    ``"pkg.module:function"``."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling: keep only groups whose rewards differ (off by default)."""

    def __post_init__(self) -> None:
        if self.kl_ctrl_type not in KL_CTRL_TYPES:
            raise ValueError(f"algorithm.kl_ctrl_type must be one of {KL_CTRL_TYPES}, got {self.kl_ctrl_type!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"algorithm.gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"algorithm.lam must be in [0, 1], got {self.lam}")
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ValueError(
                f"algorithm.clip_ratio_low must be in [0, 1) so that 1 - clip_ratio_low > 0, got {self.clip_ratio_low}"
            )
        if self.clip_ratio_high < 0.0:
            raise ValueError(f"algorithm.clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_c <= 1.0:
            raise ValueError(
                f"algorithm.clip_ratio_c must be > 1 (the dual-clip bound lies above the ratio 1), got "
                f"{self.clip_ratio_c}; use a large value such as 1e9 to turn dual-clip off"
            )
        if self.tis_cap is not None and self.tis_cap != 0 and self.tis_cap < 1:
            raise ValueError(f"algorithm.tis_cap must be 0 (off) or >= 1 (a cap on the weight), got {self.tis_cap}")
        for name in ("value_clip", "entropy_coeff", "kl_coef", "kl_loss_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name} must be >= 0, got {getattr(self, name)}")
        if self.kl_target <= 0:
            raise ValueError(f"algorithm.kl_target must be > 0 nats, got {self.kl_target}")
        if self.kl_horizon < 1:
            raise ValueError(f"algorithm.kl_horizon must be >= 1 sample, got {self.kl_horizon}")
