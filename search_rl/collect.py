"""The collect half of a training step: where the step's scored rollouts come from.

``sync`` rolls the next prompts out on the actor workers (``generate``), with DAPO's dynamic sampling when
``algorithm.filter_groups`` is on; ``one_step_off`` and ``async`` take whole groups from a ``RolloutSource`` (the
generators' bounded queue). Either way the rollouts are scored, checked against the retriever circuit breaker and
collated once into a ``TrainBatch`` (``Collected``). ``PPOTrainer`` (``trainer.py``) inherits these phases and
adds the learn half.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from search_rl.config import AlgorithmConfig, StepSettings, TrainerConfig
from search_rl.data import PromptLoader
from search_rl.datatypes import RewardResult, RolloutResult, Trajectory
from search_rl.dynamic_sampling import GroupFilter, sample_filtered
from search_rl.protocol import BatchMeta, PromptBatch, TrainBatch
from search_rl.scoring import reward_metrics, score_trajectories
from search_rl.search_stats import search_metrics
from search_rl.steps import (
    build_train_batch,
    failed_search_mask,
    merge_rollout_metrics,
    place_scores,
    response_length_metrics,
    search_failure_rate,
)
from search_rl.tracking import timer


class Workers(Protocol):
    """What the loop needs from a worker group (``WorkerGroup`` or ``LocalWorkerGroup``)."""

    def broadcast(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def map_shards(self, method: str, batch: Any, *args: Any, **kwargs: Any) -> list[Any]: ...


class RolloutSource(Protocol):
    """Where ``trainer.mode`` ``one_step_off`` / ``async`` get their rollouts instead of rolling out in lock-step
    (``async_rollout.AsyncRolloutSource``: generator actors feeding a bounded queue, weights published by version)."""

    def take(self, step: int, metrics: dict[str, float]) -> tuple[PromptBatch, list[RolloutResult]]: ...

    def publish(self, version: int) -> None: ...

    def data_state_dict(self) -> dict[str, int]: ...

    def state_dict(self) -> dict[str, int]: ...

    def load_state_dict(self, state: dict[str, int] | None, step: int) -> None: ...


class RetrieverOutage(RuntimeError):
    """Most searches of a training step failed (``on_retriever_error=observe``): the run stops rather than train on
    error observations."""


@dataclass
class Collected:
    """A step's scored rollouts: the prompts (one row per sample), their trajectories and rewards, and the
    collated batch (``token_level_scores`` placed)."""

    prompts: PromptBatch
    trajectories: list[Trajectory]
    results: list[RewardResult]
    batch: TrainBatch


def _step_seed(seed: int, step: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + step * 9_176 + salt) % (2**62)


class RolloutPhases:
    """``collect`` and its phases: rollout (sharded over the actor workers, or from the asynchronous source),
    rewards, the circuit breaker and collation. Mixed into ``PPOTrainer``, which sets the attributes below."""

    cfg: TrainerConfig
    algo: AlgorithmConfig
    settings: StepSettings
    actor: Workers
    train_data: PromptLoader
    source: RolloutSource | None
    step: int

    def collect(self, m: dict[str, float]) -> Collected:
        """The step's training data: the next prompts, rolled out with search and scored."""
        if self.algo.filter_groups.enable:
            return self._collect_filtered(m)
        prompts = self.train_data.next_batch()
        with timer("rollout", m):
            trajectories = self.generate(prompts, m)
        with timer("reward", m):
            batch, results = self.score(prompts, trajectories, m)
        return Collected(prompts, trajectories, results, batch)

    def _collect_filtered(self, m: dict[str, float]) -> Collected:
        """``collect`` with DAPO's dynamic sampling (``algorithm.filter_groups``, ``search_rl/dynamic_sampling.py``):
        generation batches of ``data.train_batch_size`` prompts until that many groups whose rewards differ are kept,
        or ``max_num_gen_batches`` are spent; then the step trains on the groups kept (padding left out)."""
        fg, n, workers = self.algo.filter_groups, self.train_data.n_samples, self.cfg.n_workers
        unit = workers // math.gcd(n, workers)  # groups per even split of the batch over the workers
        groups = GroupFilter(self.train_data.batch_size, fg.max_num_gen_batches, fg.metric, unit)
        selection = sample_filtered(self.train_data.next_batch, self._roll_out_and_score, groups)
        m.update(selection.metrics)
        chosen = selection.rollouts
        prompts, trajectories, results = chosen.prompts, list(chosen.trajectories), list(chosen.results)
        with timer("reward", m):
            batch = self.collate(prompts, trajectories, results, m, left_out=selection.padding)
        return Collected(prompts, trajectories, results, batch)

    def _roll_out_and_score(
        self, prompts: PromptBatch, metrics: dict[str, float], salt: int
    ) -> tuple[list[Trajectory], list[RewardResult]]:
        with timer("rollout", metrics):
            trajectories = self.generate(prompts, metrics, salt=salt)
        with timer("reward", metrics):
            return trajectories, self.rewards(prompts, trajectories, metrics)

    def collect_async(self, m: dict[str, float]) -> Collected:
        """``collect`` of ``trainer.mode`` one_step_off / async: whole groups from the generators' bounded queue, at
        most ``max_staleness`` weight versions old, scored here like a synchronous rollout. The batch's weight
        version is its oldest sample's."""
        assert self.source is not None
        with timer("rollout", m):
            prompts, results = self.source.take(self.step, m)
            trajectories = self._rolled_out(results, m)
            m["rollout/weight_version"] = min(r.metrics.get("rollout/weight_version", 0.0) for r in results)
        with timer("reward", m):
            batch, scores = self.score(prompts, trajectories, m)
        return Collected(prompts, trajectories, scores, batch)

    def generate(self, prompts: PromptBatch, metrics: dict[str, float], salt: int = 0) -> list[Trajectory]:
        """Sampled rollouts with search, sharded over the actor workers (``salt`` varies the seed within a step)."""
        results: list[RolloutResult] = self.actor.map_shards(
            "generate", prompts, greedy=False, seed=_step_seed(self.cfg.seed, self.step, salt)
        )
        return self._rolled_out(results, metrics)

    def _rolled_out(self, results: list[RolloutResult], metrics: dict[str, float]) -> list[Trajectory]:
        """The trajectories of the shards' results, with their rollout metrics, after the retriever check."""
        trajectories = [t for r in results for t in r.trajectories]
        metrics.update(merge_rollout_metrics(results))
        metrics.update(response_length_metrics(trajectories))
        self._check_searches(trajectories, metrics)
        return trajectories

    def _check_searches(self, trajectories: list[Trajectory], metrics: dict[str, float]) -> None:
        """The circuit breaker: stop when more than ``max_retriever_error_rate`` of the step's searches failed."""
        failed, searches = search_failure_rate(trajectories)
        metrics["rollout/retriever_error_rate"] = failed / max(searches, 1)
        limit = self.settings.max_retriever_error_rate
        if searches and failed / searches > limit:
            raise RetrieverOutage(
                f"step {self.step}: {failed} of {searches} searches failed (retriever errors), more than "
                f"actor_rollout_ref.rollout.max_retriever_error_rate={limit:g}; stopping before training on error "
                "observations. Check the retriever (retriever.url, its log), then resume: the last checkpoint is kept"
            )

    def score(
        self, prompts: PromptBatch, trajectories: list[Trajectory], metrics: dict[str, float]
    ) -> tuple[TrainBatch, list[RewardResult]]:
        """Rewards per sample, collated into a ``TrainBatch`` with token-level scores."""
        results = self.rewards(prompts, trajectories, metrics)
        return self.collate(prompts, trajectories, results, metrics), results

    def rewards(
        self, prompts: PromptBatch, trajectories: list[Trajectory], metrics: dict[str, float]
    ) -> list[RewardResult]:
        """Shaped rewards per sample, and their metrics."""
        results = score_trajectories(
            trajectories, prompts, self.settings.reward, max_response_tokens=self.settings.response_width
        )
        metrics.update(reward_metrics(results, prompts.data_sources, prompts.uids))
        metrics.update(search_metrics(trajectories, results, prompts.targets, "rollout"))
        return results

    def collate(
        self,
        prompts: PromptBatch,
        trajectories: list[Trajectory],
        results: list[RewardResult],
        metrics: dict[str, float],
        left_out: tuple[bool, ...] = (),
    ) -> TrainBatch:
        """The ``TrainBatch`` of scored rollouts; samples with a failed search (unless trained on) and those
        ``left_out`` marks (dynamic sampling's padding) get ``sample_mask`` 0."""
        meta = BatchMeta(step=self.step, weight_version=int(metrics.get("rollout/weight_version", 0)))
        batch = build_train_batch(trajectories, prompts, self.settings.pad_token_id, self.settings.response_width, meta)
        keep = None
        if not self.settings.train_on_retriever_errors:
            keep = failed_search_mask(trajectories)  # (B,)
            metrics["rollout/left_out_retriever_errors"] = float(len(keep) - int(keep.sum()))
        if any(left_out):
            kept = torch.tensor([int(not x) for x in left_out], dtype=torch.long)  # (B,)
            keep = kept if keep is None else keep * kept
        if keep is not None:
            batch = batch.replace(sample_mask=keep)
        return batch.replace(token_level_scores=place_scores(batch, [r.score for r in results]))
