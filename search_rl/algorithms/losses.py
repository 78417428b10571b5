"""Losses of the actor and critic: PPO clipped policy loss, clipped value loss, entropy, KL, loss aggregation.

Every function takes the mask of the tokens that count (``loss_mask_for``): by default the rollout's response
mask, so inserted ``<information>`` tokens and padding never contribute to a loss, a KL, an entropy or a metric.

Three registries, each with one signature:

- ``POLICY_LOSSES``: ``(logprobs, old_logprobs, advantages, loss_mask, cfg) -> (loss, metrics)``, selected by
  ``algorithm.policy_loss``; metric keys are namespaced (``"actor/clipfrac"``).
- ``KL_ESTIMATORS``: ``(logprobs, ref_logprobs) -> (B, T) per-token KL``, selected by ``algorithm.kl_loss_type``
  and ``algorithm.kl_reward_type``.
- ``LOSS_AGGREGATIONS``: ``(loss_mat, mask) -> scalar``, selected by ``algorithm.loss_agg_mode``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from search_rl.algorithms.masked import masked_mean, masked_sum
from search_rl.config import AlgorithmConfig
from search_rl.registry import Registry

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to +-20 before ``exp`` so one stale token cannot overflow the ratio (as verl)."""
LOW_VAR_KL_CLAMP = 10.0
"""The k3 estimate is clamped to +-10 per token (as verl's ``low_var_kl``)."""

PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "AlgorithmConfig"], tuple[torch.Tensor, dict[str, float]]
]
KLEstimatorFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LossAggregationFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
"""Policy losses by ``algorithm.policy_loss`` name."""
KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry("KL estimator")
"""Per-token estimators of KL(policy || reference) by name (``k1``, ``k2``, ``low_var_kl`` and aliases)."""
LOSS_AGGREGATIONS: Registry[LossAggregationFn] = Registry("loss aggregation mode")
"""Ways to reduce a (B, T) per-token loss to a scalar, by ``algorithm.loss_agg_mode`` name."""


def loss_mask_for(response_mask: torch.Tensor, attention_mask: torch.Tensor, cfg: AlgorithmConfig) -> torch.Tensor:
    """The (B, T) mask every loss, KL, entropy and advantage should use.

    ``cfg.mask_observations`` (default) gives the response mask: model tokens only. Off, it gives the attention
    mask of the response: observation tokens count too, padding still does not (the ablation of Search-R1 without
    retrieved-token masking). Use the same mask for ``AdvantageInputs.response_mask`` so that the ablation also
    treats observations as time steps.

    Args:
        response_mask: (B, T) 1 = model token, 0 = observation or padding.
        attention_mask: (B, T) or (B, P+T) 1 = real token, 0 = padding; its last T columns are used.
        cfg: the algorithm config.

    >>> from search_rl.config import AlgorithmConfig
    >>> cfg = AlgorithmConfig(mask_observations=False)
    >>> loss_mask_for(torch.tensor([[1, 0, 1, 0]]), torch.tensor([[1, 1, 1, 1, 0]]), cfg)
    tensor([[1, 1, 1, 0]])
    """
    if cfg.mask_observations:
        return response_mask
    width = response_mask.shape[-1]
    if attention_mask.shape[-1] < width:
        raise ValueError(
            f"loss_mask_for: attention_mask has {attention_mask.shape[-1]} columns, fewer than the {width} response "
            "tokens; pass the (B, P+T) or (B, T) attention mask"
        )
    return attention_mask[:, -width:].to(response_mask.dtype)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the tokens ``mask`` selects, as ``mode`` says.

    Sequences without any selected token are left out of the sequence means.

    >>> loss_mat, mask = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    >>> for mode in LOSS_AGGREGATIONS.names():  # sequence sums 6 and 4, sequence means 2 and 4, 4 tokens, T = 3
    ...     print(mode, round(aggregate_loss(loss_mat, mask, mode).item(), 4))
    seq-mean-token-mean 3.0
    seq-mean-token-sum 5.0
    seq-mean-token-sum-norm 1.6667
    token-mean 2.5
    """
    return LOSS_AGGREGATIONS.get(mode)(loss_mat, mask)


@LOSS_AGGREGATIONS.register("token-mean")
def aggregate_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every selected token of the batch: long responses weigh more (DAPO, https://arxiv.org/abs/2503.14476)."""
    return masked_mean(loss_mat, mask)


def _seq_mean(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    has_tokens = (mask.sum(-1) > 0).to(seq_values.dtype)  # (B,)
    return masked_mean(seq_values, has_tokens)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def aggregate_seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each sequence's selected tokens, then mean over sequences."""
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1), mask)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def aggregate_seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's selected tokens, then mean over sequences (GRPO paper's original form)."""
    return _seq_mean(masked_mean(loss_mat, mask, dim=-1), mask)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def aggregate_seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each sequence's selected tokens divided by the padded width T, then mean over sequences (Dr.GRPO,
    https://arxiv.org/abs/2503.20783; pad responses to a fixed ``max_response_tokens`` so that T is constant)."""
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1) / loss_mat.shape[-1], mask)


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log p - log q``: unbiased for KL(p || q) under samples of p, high variance, can be negative.

    >>> kl_k1(torch.tensor([-1.0]), torch.tensor([-3.0]))
    tensor([2.])
    """
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``0.5 * (log p - log q)^2``: biased, low variance, non-negative (http://joschu.net/blog/kl-approx.html).

    >>> kl_k2(torch.tensor([-1.0]), torch.tensor([-3.0]))
    tensor([2.])
    """
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("low_var_kl")
def kl_low_var(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3, ``q/p - log(q/p) - 1``: unbiased, non-negative, low variance (http://joschu.net/blog/kl-approx.html).
    The log-ratio is clamped to +-20 and the estimate to +-10, as in verl.

    >>> kl_low_var(torch.tensor([0.0]), torch.log(torch.tensor([0.5])))  # 0.5 - log 0.5 - 1
    tensor([0.1931])
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (log_ratio.exp() - log_ratio - 1).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


# verl's names for the same estimators, so that verl/Search-R1 configs keep working.
KL_ESTIMATORS.register("kl")(kl_k1)
KL_ESTIMATORS.register("mse")(kl_k2)
KL_ESTIMATORS.register("k3")(kl_low_var)


def estimate_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate, (B, T), with the estimator registered as ``estimator``."""
    return KL_ESTIMATORS.get(estimator)(logprobs, ref_logprobs)


@POLICY_LOSSES.register("ppo_clip")
def compute_ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (https://arxiv.org/abs/1707.06347) with an asymmetric clip range and dual-clip.

    With ``r = exp(logprobs - old_logprobs)`` and advantage ``A`` per token::

        clipped = max(-A * r, -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        loss    = min(clipped, -A * clip_ratio_c)   if A < 0   (dual-clip, https://arxiv.org/abs/1912.09729)
                  clipped                            otherwise

    aggregated over ``loss_mask`` with ``cfg.loss_agg_mode``.

    Args:
        logprobs: (B, T) log-probs of the taken tokens under the current policy (with grad).
        old_logprobs: (B, T) the same under the policy that sampled them.
        advantages: (B, T) advantages.
        loss_mask: (B, T) tokens that count.
        cfg: clip ranges and aggregation mode.

    Returns:
        ``(loss, metrics)`` with metrics ``actor/pg_loss``, ``actor/clipfrac`` (tokens where clipping is active),
        ``actor/pg_clipfrac_lower`` (tokens where the dual clip is active) and ``actor/ppo_kl`` (k1 estimate of
        KL(old || current)).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    ratio = log_ratio.exp()  # (B, T)
    unclipped = -advantages * ratio  # (B, T)
    clipped_ratio = ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    clipped = -advantages * clipped_ratio  # (B, T)
    pessimistic = torch.maximum(unclipped, clipped)  # (B, T)
    dual_bound = -advantages * cfg.clip_ratio_c  # (B, T)
    is_negative = advantages < 0
    per_token = torch.where(is_negative, torch.minimum(pessimistic, dual_bound), pessimistic)  # (B, T)
    loss = aggregate_loss(per_token, loss_mask, cfg.loss_agg_mode)
    metrics = {
        "actor/pg_loss": loss.item(),
        "actor/clipfrac": masked_mean((clipped > unclipped).float(), loss_mask).item(),
        "actor/pg_clipfrac_lower": masked_mean((is_negative & (pessimistic > dual_bound)).float(), loss_mask).item(),
        "actor/ppo_kl": masked_mean(-log_ratio, loss_mask).item(),
    }
    return loss, metrics


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss: ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``, with
    ``c = cfg.value_clip``, aggregated over ``loss_mask`` with ``cfg.loss_agg_mode``.

    Args:
        values: (B, T) current critic predictions (with grad).
        old_values: (B, T) the predictions used for the advantages.
        returns: (B, T) targets (``AdvantageOutputs.returns``).
        loss_mask: (B, T) tokens that count.
        cfg: ``value_clip`` and ``loss_agg_mode``.

    Returns:
        ``(loss, metrics)`` with ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean``.

    >>> from search_rl.config import AlgorithmConfig
    >>> cfg = AlgorithmConfig(value_clip=0.5)
    >>> loss, m = compute_value_loss(torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.tensor([[3.0]]),
    ...                              torch.tensor([[1]]), cfg)
    >>> loss.item(), m["critic/vf_clipfrac"]  # max((2-3)^2, (1.5-3)^2) / 2
    (1.125, 1.0)
    """
    clipped_values = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)  # (B, T)
    unclipped_loss = (values - returns) ** 2  # (B, T)
    clipped_loss = (clipped_values - returns) ** 2  # (B, T)
    per_token = 0.5 * torch.maximum(unclipped_loss, clipped_loss)  # (B, T)
    loss = aggregate_loss(per_token, loss_mask, cfg.loss_agg_mode)
    metrics = {
        "critic/vf_loss": loss.item(),
        "critic/vf_clipfrac": masked_mean((clipped_loss > unclipped_loss).float(), loss_mask).item(),
        "critic/vpred_mean": masked_mean(values.detach(), loss_mask).item(),
    }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: (B, T, V) logits -> (B, T) nats.

    >>> entropy_from_logits(torch.zeros(1, 1, 4))  # uniform over 4: log 4
    tensor([[1.3863]])
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return -(log_probs.exp() * log_probs).sum(-1)


def truncated_is_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, loss_mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights over the rollout/trainer mismatch (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): per token ``min(exp(old - rollout), cap)``, detached.

    ``old_logprobs`` are the trainer's log-probs of the policy the update starts from, ``rollout_logprobs`` the
    engine's, which differ when the engine computes differently (vLLM in bf16) or sampled with older weights
    (asynchronous training). Scaling a token's advantage by its weight scales its policy-gradient term.

    Returns:
        ``((B, T) weights, metrics)``: ``actor/tis_weight_mean``, ``actor/tis_truncated_frac`` (tokens at the cap)
        and ``actor/rollout_trainer_logprob_diff`` (mean absolute log-prob difference), over ``loss_mask``.
    """
    log_ratio = (old_logprobs - rollout_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    ratio = log_ratio.exp()
    weights = ratio.clamp(max=cap)
    metrics = {
        "actor/tis_weight_mean": masked_mean(weights, loss_mask).item(),
        "actor/tis_truncated_frac": masked_mean((ratio > cap).float(), loss_mask).item(),
        "actor/rollout_trainer_logprob_diff": masked_mean(log_ratio.abs(), loss_mask).item(),
    }
    return weights, metrics


def compute_actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full actor objective: ``policy_loss - entropy_coeff * entropy + kl_loss_coef * KL(policy || ref)``.

    The policy loss is ``POLICY_LOSSES.get(cfg.policy_loss)``; the KL term is added when ``cfg.use_kl_loss``;
    all three terms use ``loss_mask`` and ``cfg.loss_agg_mode``.

    Args:
        logprobs: (B, T) current log-probs (with grad).
        old_logprobs: (B, T) log-probs under the sampling policy.
        advantages: (B, T) advantages.
        loss_mask: (B, T) tokens that count (``loss_mask_for``).
        cfg: the algorithm config.
        entropy: (B, T) per-token entropy (``entropy_from_logits``); needed when ``cfg.entropy_coeff > 0``,
            logged as ``actor/entropy`` whenever given.
        ref_logprobs: (B, T) reference-policy log-probs; needed when ``cfg.use_kl_loss``.
        rollout_logprobs: (B, T) the engine's sampling log-probs; needed when ``cfg.tis_cap > 0``: the advantages
            are then scaled by ``truncated_is_weights`` (the policy losses are positively homogeneous in them).

    Returns:
        ``(loss, metrics)``: the policy loss's metrics plus ``actor/entropy``, ``actor/kl_loss``, ``actor/loss``
        and, with TIS, ``actor/tis_*``.

    Raises:
        ValueError: when a term the config asks for has no input.
    """
    tis_metrics: dict[str, float] = {}
    if cfg.tis_cap:  # None (unresolved) and 0 are off
        if rollout_logprobs is None:
            raise ValueError("algorithm.tis_cap > 0 but no rollout_logprobs were given (the engine's log-probs)")
        weights, tis_metrics = truncated_is_weights(old_logprobs, rollout_logprobs, loss_mask, cfg.tis_cap)
        advantages = advantages * weights
    loss, metrics = POLICY_LOSSES.get(cfg.policy_loss)(logprobs, old_logprobs, advantages, loss_mask, cfg)
    metrics.update(tis_metrics)
    if cfg.entropy_coeff > 0 and entropy is None:
        raise ValueError("algorithm.entropy_coeff > 0 but no entropy was given; pass entropy_from_logits(logits)")
    if entropy is not None:
        # The metric is the per-token mean in nats whatever the aggregation, so runs with different loss_agg_mode
        # compare; the loss term uses the configured aggregation.
        metrics["actor/entropy"] = masked_mean(entropy.detach(), loss_mask).item()
        if cfg.entropy_coeff > 0:
            loss = loss - cfg.entropy_coeff * aggregate_loss(entropy, loss_mask, cfg.loss_agg_mode)
    if cfg.use_kl_loss:
        if ref_logprobs is None:
            raise ValueError(
                "algorithm.use_kl_loss is true but no ref_logprobs were given; compute them with the reference "
                "policy, or set algorithm.use_kl_loss=false"
            )
        kl = estimate_kl(logprobs, ref_logprobs, cfg.kl_loss_type)  # (B, T)
        kl_loss = aggregate_loss(kl, loss_mask, cfg.loss_agg_mode)
        metrics["actor/kl_loss"] = kl_loss.item()
        metrics["actor/kl"] = masked_mean(kl.detach(), loss_mask).item()
        loss = loss + cfg.kl_loss_coef * kl_loss
    metrics["actor/loss"] = loss.item()
    return loss, metrics
