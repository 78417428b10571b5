"""``TrainableModel``: a model with its AdamW, learning-rate schedule and the PPO mini/micro-batch update loop.

Shared by the actor and the critic. One ``ppo_update`` call runs ``epochs`` passes over the worker's shard; each pass
splits it into mini-batches (one optimizer step each, the same count on every rank) and each mini-batch into
micro-batches (one forward/backward each). A micro-batch's loss is weighted by its share of the mini-batch's
tokens over *all* ranks (sequences, for the sequence-mean aggregations), so gradient accumulation and data
parallelism give the same update as one pass over the whole mini-batch: the ``token-mean`` caveat of
``docs/algorithms.md`` is handled here.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import nn

from search_rl.batches import TrainBatch
from search_rl.config import OptimConfig
from search_rl.state_files import load_state
from search_rl.workers import distributed as D
from search_rl.workers.distributed import WorkerSpec, all_reduce_sum
from search_rl.workers.micro_batches import length_order, micro_batches

LossFn = Callable[[TrainBatch], tuple[torch.Tensor, dict[str, float]]]
"""``micro_batch -> (loss aggregated over the micro-batch, metrics)``."""

MiniBatchScope = Callable[[TrainBatch], AbstractContextManager[object]]
"""``mini_batch -> context`` entered around a mini-batch's micro-batch passes, before the gradient is clipped (the
actor encodes the mini-batch's shared prompts on entry and back-propagates through them on exit)."""


def aggregation_weight(loss_mask: torch.Tensor, loss_agg_mode: str) -> float:
    """What a micro-batch counts for in the mini-batch mean: its selected tokens for ``token-mean``, its sequences
    with at least one selected token for the sequence-mean modes."""
    if loss_agg_mode == "token-mean":
        return float(loss_mask.sum())
    return float((loss_mask.sum(-1) > 0).sum())


def shuffled_order(uids: tuple[str, ...], gen: torch.Generator, keep_groups: bool) -> torch.Tensor:
    """A random order of the rows; with ``keep_groups``, of the groups (rows sharing a ``uid``), each kept whole and
    in its own order."""
    if not keep_groups:
        return torch.randperm(len(uids), generator=gen)
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    rows = list(groups.values())
    picked = torch.randperm(len(rows), generator=gen).tolist()
    return torch.tensor([i for g in picked for i in rows[g]], dtype=torch.long)


def epoch_order(uids: tuple[str, ...], shuffle_seed: int | None, epoch: int, keep_groups: bool) -> torch.Tensor:
    """The row order of one update epoch, cut into mini-batches in turn: shuffled from ``(shuffle_seed, epoch)``
    (``shuffled_order``), or the batch's own order when ``shuffle_seed`` is None."""
    if shuffle_seed is None:
        return torch.arange(len(uids))
    return shuffled_order(uids, torch.Generator().manual_seed(shuffle_seed * 1000 + epoch), keep_groups)


class MetricMean:
    """Weighted means of named metrics over micro-batches, mini-batches and epochs."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = defaultdict(float)
        self._weight: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, float], weight: float = 1.0) -> None:
        for k, v in metrics.items():
            self._sum[k] += v * weight
            self._weight[k] += weight

    def means(self) -> dict[str, float]:
        return {k: self._sum[k] / self._weight[k] for k in self._sum if self._weight[k] > 0}


class TrainableModel:
    """A model and its optimizer on one worker.

    Args:
        model: the FSDP2-sharded module being trained (fp32 parameters).
        optim: learning rate, weight decay, warm-up.
        grad_clip: global gradient-norm bound (0 = none).
        spec: rank, world size, device.
        prefix: metric namespace (``actor`` or ``critic``).
    """

    def __init__(self, model: nn.Module, optim: OptimConfig, grad_clip: float, spec: WorkerSpec, prefix: str) -> None:
        self.model, self.grad_clip, self.spec, self.prefix = model, grad_clip, spec, prefix
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, weight_decay=optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: optim.lr_factor(step))

    def ppo_update(
        self,
        batch: TrainBatch,
        loss_fn: LossFn,
        *,
        mini_batch_size: int,
        micro_batch_size: int,
        epochs: int,
        shuffle_seed: int | None,
        loss_agg_mode: str,
        keep_groups: bool = False,
        mini_batch_scope: MiniBatchScope | None = None,
        max_tokens: int = 0,
    ) -> dict[str, float]:
        """Run the update passes over this worker's shard and return mean metrics.

        ``keep_groups``: shuffle whole groups (rows of one ``uid`` stay together), so a mini-batch holds complete
        groups. ``mini_batch_scope``: a context around each mini-batch's passes (``MiniBatchScope``). ``max_tokens``:
        > 0 sizes micro-batches by padded tokens instead of ``micro_batch_size`` samples (``micro_batches``).

        ``mini_batch_size`` is per worker; every rank must hold a shard of the same size so that all take the same
        number of optimizer steps (the collectives pair up).
        """
        batch.require("loss_mask")
        assert batch.loss_mask is not None
        self.model.train()
        metrics = MetricMean()
        for epoch in range(epochs):
            order = epoch_order(batch.uids, shuffle_seed, epoch, keep_groups)
            for mini in batch.select(order).split_by_size(mini_batch_size):
                metrics.add(
                    self._mini_batch_step(mini, loss_fn, micro_batch_size, loss_agg_mode, mini_batch_scope, max_tokens)
                )
        return metrics.means()

    def _mini_batch_step(
        self,
        mini: TrainBatch,
        loss_fn: LossFn,
        micro_batch_size: int,
        loss_agg_mode: str,
        scope: MiniBatchScope | None = None,
        max_tokens: int = 0,
    ) -> dict[str, float]:
        assert mini.loss_mask is not None
        # Micro-batches of similar lengths pad less (each is cut to its longest row); the weighted sum is order-free.
        mini = mini.select(length_order(mini))
        micros = micro_batches(mini, micro_batch_size, max_tokens)
        weights = [aggregation_weight(m.loss_mask, loss_agg_mode) for m in micros]  # type: ignore[arg-type]
        total = all_reduce_sum(sum(weights), self.spec)
        self.optimizer.zero_grad(set_to_none=True)
        metrics = MetricMean()
        with scope(mini) if scope is not None else contextlib.nullcontext():
            # A token budget can give ranks different micro-batch counts; sharded passes are collectives, so a rank
            # with fewer repeats its last one with weight 0 (nothing added to the gradient).
            for i, (micro, real) in enumerate(D.matched_passes(micros, self.spec)):
                weight = weights[i] if real else 0.0
                loss, micro_metrics = loss_fn(micro)
                share = weight / total if total > 0 else 0.0
                # Ranks average their gradients, so each rank's share is scaled back up by the world size.
                (loss * share * self.spec.world_size).backward()
                if real:
                    metrics.add(micro_metrics, weight=max(weight, 1e-12))
        grad_norm = self._reduce_and_clip()
        out = metrics.means()
        if math.isfinite(grad_norm):
            self.optimizer.step()
            out[f"{self.prefix}/skipped_steps"] = 0.0
        else:  # a NaN/inf gradient would poison the weights and the Adam moments for good
            out[f"{self.prefix}/skipped_steps"] = 1.0
        self.optimizer.zero_grad(set_to_none=True)
        out[f"{self.prefix}/lr"] = float(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        out[f"{self.prefix}/grad_norm"] = grad_norm
        return out

    def _reduce_and_clip(self) -> float:
        """Clip the (already reduced: FSDP2 reduce-scatters in backward) gradients; returns the global norm."""
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        full = getattr(norm, "full_tensor", None)  # a DTensor over sharded gradients
        return float(full() if callable(full) else norm)

    def optimizer_state(self) -> dict[str, object]:
        """Optimizer and schedule state, unsharded and keyed by parameter name (every rank must call it; only rank
        0's copy is filled), so a run saved by N ranks resumes on M."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        return {"optimizer": optim, "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict[str, object]) -> None:
        """Load what ``optimizer_state`` returned (written by any number of ranks); every rank passes it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)  # type: ignore[arg-type]
        self.scheduler.load_state_dict(state["scheduler"])  # type: ignore[arg-type]

    def save_optimizer(self, path: Path) -> None:
        state = self.optimizer_state()
        if self.spec.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, path)

    def load_optimizer(self, path: Path) -> None:
        self.load_optimizer_state(load_state(path))
