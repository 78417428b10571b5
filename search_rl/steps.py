"""The driver's pure per-batch computations: collate, place rewards, mask, KL-in-reward, advantages, metric merging.

No Ray and no models here (the trainer calls these between worker calls), so each is tested directly. The one rule
they enforce: the mask every loss, KL, entropy and advantage uses is ``algorithms.loss_mask_for`` of the rollout's
response mask, computed once here and stored as ``TrainBatch.loss_mask``; the advantage estimators get the same mask
(``docs/algorithms.md``), so the masking ablation switch flips every term at once. A sample that
``TrainBatch.sample_mask`` leaves out (a failed search) gets an all-zero row in that mask and no share in its
group's baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from search_rl.algorithms import ADVANTAGES, AdvantageInputs, KLController, apply_kl_penalty, loss_mask_for
from search_rl.algorithms.masked import masked_mean
from search_rl.config import AlgorithmConfig
from search_rl.datatypes import RolloutResult, Trajectory
from search_rl.protocol import BatchMeta, PromptBatch, TrainBatch

SUMMED_ROLLOUT_METRICS = frozenset(
    {
        "rollout/retriever_errors",
        "rollout/retriever_retries",
        "rollout/truncated_prompt_tokens",
        "rollout/truncated_obs_tokens",
        "rollout/dropped_passages",
        "rollout/response_budget_hits",
        "rollout/gen_tokens_per_s",
    }
)
"""Rollout metrics that are counts or rates of parallel workers: summed over shards (the rest are averaged)."""


def build_train_batch(
    trajectories: Sequence[Trajectory], prompts: PromptBatch, pad_token_id: int, response_width: int, meta: BatchMeta
) -> TrainBatch:
    """The step's batch: ``trajectories`` of ``prompts`` collated once (``TrainBatch.from_trajectories``), responses
    padded to ``response_width`` (``max_response_tokens``)."""
    return TrainBatch.from_trajectories(
        trajectories,
        prompts.uids,
        prompts.data_sources,
        pad_token_id=pad_token_id,
        response_width=response_width,
        meta=meta,
    )


def place_scores(batch: TrainBatch, scores: Sequence[float]) -> torch.Tensor:
    """(B, T) token-level scores: each sample's outcome reward on its last model token (on its last real token if
    it has no model token), 0 elsewhere."""
    b, t = batch.response_ids.shape
    out = torch.zeros((b, t), dtype=torch.float32)
    positions = torch.arange(t).expand(b, t)  # (B, T)
    last_model = torch.where(batch.response_mask.bool(), positions, -1).max(-1).values  # (B,)
    last_real = torch.where(batch.response_attention_mask.bool(), positions, 0).max(-1).values  # (B,)
    where = torch.where(last_model >= 0, last_model, last_real)  # (B,)
    out[torch.arange(b), where] = torch.tensor(list(scores), dtype=torch.float32)
    return out


def compute_advantages(
    batch: TrainBatch,
    algo: AlgorithmConfig,
    kl_ctrl: KLController | None,
    baseline_rewards: torch.Tensor | None = None,
) -> tuple[TrainBatch, dict[str, float]]:
    """Fill ``loss_mask``, ``token_level_rewards``, ``advantages`` and ``returns`` (no branching on estimator names).

    Needs ``token_level_scores``; ``old_logprobs`` and ``ref_logprobs`` when the KL enters the reward; ``values``
    for estimators that read them.
    """
    batch.require("token_level_scores")
    assert batch.token_level_scores is not None
    loss_mask = loss_mask_for(batch.response_mask, batch.attention_mask, algo)  # (B, T)
    group_ids = list(batch.uids)
    if batch.sample_mask is not None:  # left-out samples: no loss tokens, and a group of their own (no baseline)
        keep = batch.sample_mask.to(loss_mask.dtype)  # (B,)
        loss_mask = loss_mask * keep.unsqueeze(-1)  # (B, T)
        kept = keep.tolist()
        group_ids = [uid if kept[i] else f"{uid}#left-out-{i}" for i, uid in enumerate(group_ids)]
    rewards, metrics = batch.token_level_scores, dict[str, float]()
    if algo.use_kl_in_reward:
        batch.require("old_logprobs", "ref_logprobs")
        if kl_ctrl is None:
            raise ValueError("algorithm.use_kl_in_reward needs a KL controller (build_kl_controller)")
        assert batch.old_logprobs is not None and batch.ref_logprobs is not None
        rewards, metrics = apply_kl_penalty(
            rewards, batch.old_logprobs, batch.ref_logprobs, loss_mask, kl_ctrl, algo.kl_reward_type
        )
    inputs = AdvantageInputs(
        token_level_rewards=rewards,
        response_mask=loss_mask,
        values=batch.values,
        group_ids=group_ids,
        baseline_rewards=baseline_rewards,
    )
    out = ADVANTAGES.get(algo.adv_estimator)(inputs, algo)
    batch = batch.replace(
        loss_mask=loss_mask, token_level_rewards=rewards, advantages=out.advantages, returns=out.returns
    )
    metrics = {**metrics, **_advantage_metrics(batch)}
    return batch, metrics


def _advantage_metrics(batch: TrainBatch) -> dict[str, float]:
    assert batch.loss_mask is not None and batch.advantages is not None and batch.returns is not None
    mask = batch.loss_mask
    adv = batch.advantages[mask.bool()]
    metrics = {
        "critic/advantages_mean": masked_mean(batch.advantages, mask).item(),
        "critic/advantages_max": float(adv.max()) if adv.numel() else 0.0,
        "critic/advantages_min": float(adv.min()) if adv.numel() else 0.0,
        "critic/returns_mean": masked_mean(batch.returns, mask).item(),
    }
    if batch.values is not None:
        metrics["critic/values_mean"] = masked_mean(batch.values, mask).item()
    return metrics


def failed_search_mask(trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """(B,) 1 for a trajectory whose searches all succeeded, 0 for one that saw a retriever error observation
    (``rollout.on_retriever_error=observe``): its later turns answer an error message, not the passages."""
    return torch.tensor([int(t.stats.retriever_errors == 0) for t in trajectories], dtype=torch.long)


def search_failure_rate(trajectories: Sequence[Trajectory]) -> tuple[int, int]:
    """``(failed searches, searches)`` over the trajectories."""
    return sum(t.stats.retriever_errors for t in trajectories), sum(t.num_searches for t in trajectories)


def merge_rollout_metrics(results: Sequence[RolloutResult]) -> dict[str, float]:
    """One metric dict from the workers' shards: ``timing/*`` is the slowest shard (the wall time), counts and
    throughputs in ``SUMMED_ROLLOUT_METRICS`` are summed, the rest are means weighted by shard size."""
    total = sum(len(r.trajectories) for r in results)
    merged: dict[str, float] = {}
    for key in sorted({k for r in results for k in r.metrics}):
        values = [(len(r.trajectories), r.metrics[key]) for r in results if key in r.metrics]
        if key.startswith("timing/"):
            merged[key] = max(v for _, v in values)
        elif key in SUMMED_ROLLOUT_METRICS:
            merged[key] = sum(v for _, v in values)
        else:
            merged[key] = sum(n * v for n, v in values) / max(total, 1)
    return merged


def response_length_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Lengths in tokens: whole responses and model tokens only (mean / max)."""
    lengths = [int(t.response_ids.shape[0]) for t in trajectories]
    model = [int(t.response_mask.sum()) for t in trajectories]
    n = max(len(lengths), 1)
    return {
        "response_length/mean": sum(lengths) / n,
        "response_length/max": float(max(lengths, default=0)),
        "response_length/model_tokens_mean": sum(model) / n,
        "response_length/model_tokens_max": float(max(model, default=0)),
        "prompt_length/mean": sum(int(t.prompt_ids.shape[0]) for t in trajectories) / n,
    }
