"""GSPO, the sequence-level policy loss (Zheng et al. 2025, https://arxiv.org/abs/2507.18071), as ``POLICY_LOSSES``
entry ``gspo``.

PPO clips each token's ratio; GSPO clips one ratio per response, the geometric mean of its tokens' ratios::

    s_i = exp( mean over the loss-mask tokens t of (logprobs_it - old_logprobs_it) )

so a response is clipped as a whole, and a single token whose ratio has moved far cannot be clipped alone while its
neighbours keep their gradient. The mean runs over the loss mask: inserted ``<information>`` tokens are not part of
the response's likelihood and neither count nor dilute it. Gradients still flow per token through the paper's
token form ``s_it = sg[s_i] * exp(logprobs_it - sg[logprobs_it])`` (value ``s_i``, gradient ``s_i * d logprobs_it``),
which lets advantages vary per token (the paper's GSPO-token; with one advantage per response it is exactly GSPO).
"""

from __future__ import annotations

import torch

from search_rl.algorithms.losses import LOG_RATIO_CLAMP, POLICY_LOSSES, aggregate_loss
from search_rl.algorithms.masked import masked_mean
from search_rl.config import AlgorithmConfig


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B,) ``log s_i``: the mean log-ratio over each sequence's loss-mask tokens (0 for a sequence without any).

    >>> sequence_log_ratio(torch.tensor([[0.1, -0.3, 0.5, 9.0]]), torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]]))
    tensor([0.1000])
    """
    return masked_mean(logprobs - old_logprobs, loss_mask, dim=-1)


@POLICY_LOSSES.register("gspo")
def compute_gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's clipped surrogate with the sequence-level ratio, per token::

        loss_it = max(-A_it * s_it, -A_it * clip(s_it, 1 - clip_ratio_low, 1 + clip_ratio_high))

    aggregated over ``loss_mask`` with ``cfg.loss_agg_mode``; the paper's objective is ``seq-mean-token-mean`` (each
    response weighs the same), which the ``gspo`` preset sets, with its small ranges 3e-4 / 4e-4. No dual clip: the
    sequence ratio is already bounded by its clip. ``log s_i`` is clamped to +-20 before ``exp``.

    Args:
        logprobs: (B, T) log-probs of the taken tokens under the current policy (with grad).
        old_logprobs: (B, T) the same under the policy that sampled them.
        advantages: (B, T) advantages.
        loss_mask: (B, T) tokens that count (the sequence mean runs over them).
        cfg: clip ranges and aggregation mode.

    Returns:
        ``(loss, metrics)`` with ``actor/pg_loss``, ``actor/clipfrac`` (tokens where the clipped term is taken),
        ``actor/pg_clipfrac_lower`` (always 0: no dual clip), ``actor/ppo_kl`` (k1 estimate of KL(old || current)
        per token), ``actor/seq_ratio_mean`` (mean ``s_i`` over sequences with tokens) and ``actor/seq_clipfrac``
        (share of those sequences whose ``s_i`` lies outside the clip range).
    """
    seq_log_ratio = sequence_log_ratio(logprobs.detach(), old_logprobs, loss_mask)  # (B,)
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # Value s_i on every token, gradient s_i * d logprobs_it: the paper's token form.
    ratio = torch.exp(logprobs - logprobs.detach() + seq_log_ratio.unsqueeze(-1))  # (B, T)
    unclipped = -advantages * ratio  # (B, T)
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)  # (B, T)
    per_token = torch.maximum(unclipped, clipped)  # (B, T)
    loss = aggregate_loss(per_token, loss_mask, cfg.loss_agg_mode)

    has_tokens = (loss_mask.sum(-1) > 0).float()  # (B,)
    seq_ratio = seq_log_ratio.exp()  # (B,)
    outside = ((seq_ratio < 1.0 - cfg.clip_ratio_low) | (seq_ratio > 1.0 + cfg.clip_ratio_high)).float()  # (B,)
    metrics = {
        "actor/pg_loss": loss.item(),
        "actor/clipfrac": masked_mean((clipped > unclipped).float(), loss_mask).item(),
        "actor/pg_clipfrac_lower": 0.0,
        "actor/ppo_kl": masked_mean(old_logprobs - logprobs.detach(), loss_mask).item(),
        "actor/seq_ratio_mean": masked_mean(seq_ratio, has_tokens).item(),
        "actor/seq_clipfrac": masked_mean(outside, has_tokens).item(),
    }
    return loss, metrics
