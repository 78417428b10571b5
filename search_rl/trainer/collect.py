"""The collect half of a training step: where the step's scored rollouts come from, and how new weights reach the
engines that produced them.

A ``Collector`` is handed to ``PPOStep`` (``trainer/ppo.py``); the trainer never branches on ``trainer.mode``:

- ``SyncCollector`` (``trainer.mode=sync``) rolls the next prompts out on the actor workers (``generate``), with
  DAPO's dynamic sampling when ``algorithm.filter_groups`` is on, and syncs the actor's engines after an update;
- ``AsyncCollector`` (``one_step_off`` / ``async``) takes whole groups from a ``RolloutSource`` (the generators'
  bounded queue, ``async_rollout/``) and publishes the weights for the generators to pull.

Either way the rollouts are scored, checked against the retriever circuit breaker and collated once into a
``TrainBatch`` (``Collected``) by the shared ``Scorer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from search_rl.batches import BatchMeta, PromptBatch, TrainBatch
from search_rl.config import AlgorithmConfig, StepSettings
from search_rl.datatypes import RewardResult, RolloutResult, Trajectory
from search_rl.prompt_data import PromptLoader
from search_rl.reward.scoring import reward_metrics, score_trajectories
from search_rl.reward.search_stats import search_metrics
from search_rl.seeds import step_seed
from search_rl.tracking import timer
from search_rl.trainer.dynamic_sampling import GroupFilter, sample_filtered
from search_rl.trainer.steps import (
    build_train_batch,
    failed_search_mask,
    merge_rollout_metrics,
    place_scores,
    response_length_metrics,
    search_failure_rate,
)
from search_rl.workers import Workers
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker


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


class Collector(Protocol):
    """Where a step's scored rollouts come from (``SyncCollector`` or ``AsyncCollector``)."""

    def collect(self, step: int, m: dict[str, float]) -> Collected: ...

    def sync_weights(self, step: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], step: int) -> None: ...


def sync_actor_engines(actor: Workers[ActorRolloutRefWorker], version: int) -> None:
    """Load the actor's trained weights into its own rollout engines, versioned by the step that produced them.

    Raises:
        RuntimeError: an engine reports another version.
    """
    versions = [v for v, _ in actor.broadcast(ActorRolloutRefWorker.sync_weights, version)]
    if set(versions) != {version}:
        raise RuntimeError(f"weight sync: engines report versions {versions}, expected {version}")


class Scorer:
    """Rewards, the retriever circuit breaker and collation: what every collector does with its rollouts."""

    def __init__(self, settings: StepSettings) -> None:
        self.settings = settings

    def rolled_out(self, results: list[RolloutResult], step: int, metrics: dict[str, float]) -> list[Trajectory]:
        """The trajectories of the shards' results, with their rollout metrics, after the retriever check."""
        trajectories = [t for r in results for t in r.trajectories]
        metrics.update(merge_rollout_metrics(results))
        metrics.update(response_length_metrics(trajectories))
        self.check_searches(trajectories, step, metrics)
        return trajectories

    def check_searches(self, trajectories: list[Trajectory], step: int, metrics: dict[str, float]) -> None:
        """The circuit breaker: stop when more than ``max_retriever_error_rate`` of the step's searches failed."""
        failed, searches = search_failure_rate(trajectories)
        metrics["rollout/retriever_error_rate"] = failed / max(searches, 1)
        limit = self.settings.max_retriever_error_rate
        if searches and failed / searches > limit:
            raise RetrieverOutage(
                f"step {step}: {failed} of {searches} searches failed (retriever errors), more than "
                f"actor_rollout_ref.rollout.max_retriever_error_rate={limit:g}; stopping before training on error "
                "observations. Check the retriever (retriever.url, its log), then resume: the last checkpoint is kept"
            )

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

    def score(self, prompts: PromptBatch, trajectories: list[Trajectory], step: int, m: dict[str, float]) -> Collected:
        """Rewards per sample, collated into a ``TrainBatch`` with token-level scores."""
        results = self.rewards(prompts, trajectories, m)
        return Collected(prompts, trajectories, results, self.collate(prompts, trajectories, results, step, m))

    def collate(
        self,
        prompts: PromptBatch,
        trajectories: list[Trajectory],
        results: list[RewardResult],
        step: int,
        metrics: dict[str, float],
        left_out: tuple[bool, ...] = (),
    ) -> TrainBatch:
        """The ``TrainBatch`` of scored rollouts; samples with a failed search (unless trained on) and those
        ``left_out`` marks (dynamic sampling's padding) get ``sample_mask`` 0."""
        s = self.settings
        meta = BatchMeta(step=step, weight_version=int(metrics.get("rollout/weight_version", 0)))
        batch = build_train_batch(trajectories, prompts, s.pad_token_id, s.response_width, meta)
        keep = None
        if not s.train_on_retriever_errors:
            keep = failed_search_mask(trajectories)  # (B,)
            metrics["rollout/left_out_retriever_errors"] = float(len(keep) - int(keep.sum()))
        if any(left_out):
            kept = torch.tensor([int(not x) for x in left_out], dtype=torch.long)  # (B,)
            keep = kept if keep is None else keep * kept
        if keep is not None:
            batch = batch.replace(sample_mask=keep)
        return batch.replace(token_level_scores=place_scores(batch, [r.score for r in results]))


class SyncCollector:
    """``trainer.mode=sync``: the next prompts rolled out on the actor workers, in lock-step with training.

    Args:
        actor: the actor group (rolls out, and holds the engines to sync).
        train_data: the resumable prompt loader.
        algo: the objective (``filter_groups`` turns dynamic sampling on).
        settings: scoring and collation.
        seed: ``trainer.seed``; n_workers: ``trainer.n_workers`` (dynamic sampling keeps groups in even splits).
    """

    def __init__(
        self,
        actor: Workers[ActorRolloutRefWorker],
        train_data: PromptLoader,
        algo: AlgorithmConfig,
        settings: StepSettings,
        seed: int,
        n_workers: int,
    ) -> None:
        self.actor, self.train_data, self.algo = actor, train_data, algo
        self.scorer, self.seed, self.n_workers = Scorer(settings), seed, n_workers

    def collect(self, step: int, m: dict[str, float]) -> Collected:
        """The step's training data: the next prompts, rolled out with search and scored."""
        if self.algo.filter_groups.enable:
            return self._collect_filtered(step, m)
        prompts = self.train_data.next_batch()
        with timer("rollout", m):
            trajectories = self.generate(prompts, step, m)
        with timer("reward", m):
            return self.scorer.score(prompts, trajectories, step, m)

    def _collect_filtered(self, step: int, m: dict[str, float]) -> Collected:
        """``collect`` with DAPO's dynamic sampling (``algorithm.filter_groups``, ``trainer/dynamic_sampling.py``):
        generation batches of ``data.train_batch_size`` prompts until that many groups whose rewards differ are kept,
        or ``max_num_gen_batches`` are spent; then the step trains on the groups kept (padding left out)."""
        fg, n = self.algo.filter_groups, self.train_data.n_samples
        unit = self.n_workers // math.gcd(n, self.n_workers)  # groups per even split of the batch over the workers
        groups = GroupFilter(self.train_data.batch_size, fg.max_num_gen_batches, fg.metric, unit)

        def roll_out_and_score(
            prompts: PromptBatch, metrics: dict[str, float], salt: int
        ) -> tuple[list[Trajectory], list[RewardResult]]:
            with timer("rollout", metrics):
                trajectories = self.generate(prompts, step, metrics, salt=salt)
            with timer("reward", metrics):
                return trajectories, self.scorer.rewards(prompts, trajectories, metrics)

        selection = sample_filtered(self.train_data.next_batch, roll_out_and_score, groups)
        m.update(selection.metrics)
        chosen = selection.rollouts
        prompts, trajectories, results = chosen.prompts, list(chosen.trajectories), list(chosen.results)
        with timer("reward", m):
            batch = self.scorer.collate(prompts, trajectories, results, step, m, left_out=selection.padding)
        return Collected(prompts, trajectories, results, batch)

    def generate(self, prompts: PromptBatch, step: int, metrics: dict[str, float], salt: int = 0) -> list[Trajectory]:
        """Sampled rollouts with search, sharded over the actor workers (``salt`` varies the seed within a step)."""
        results = self.actor.map_shards(
            ActorRolloutRefWorker.generate, prompts, greedy=False, seed=step_seed(self.seed, step, salt)
        )
        return self.scorer.rolled_out(results, step, metrics)

    def sync_weights(self, step: int) -> None:
        sync_actor_engines(self.actor, step)

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.train_data.state_dict(), "rollout_source": None}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.train_data.load_state_dict(state["data"])


class AsyncCollector:
    """``trainer.mode`` one_step_off / async: whole groups from the generators' bounded queue, at most
    ``max_staleness`` weight versions old, scored here like a synchronous rollout; new weights are published for the
    generators to pull."""

    def __init__(self, source: RolloutSource, train_data: PromptLoader, settings: StepSettings) -> None:
        self.source, self.train_data, self.scorer = source, train_data, Scorer(settings)

    def collect(self, step: int, m: dict[str, float]) -> Collected:
        """The batch's weight version is its oldest sample's."""
        with timer("rollout", m):
            prompts, results = self.source.take(step, m)
            trajectories = self.scorer.rolled_out(results, step, m)
            m["rollout/weight_version"] = min(r.metrics.get("rollout/weight_version", 0.0) for r in results)
        with timer("reward", m):
            return self.scorer.score(prompts, trajectories, step, m)

    def sync_weights(self, step: int) -> None:
        self.source.publish(step)

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.source.data_state_dict(), "rollout_source": self.source.state_dict()}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """What was queued or in flight is dropped; its prompts are drawn again."""
        self.train_data.load_state_dict(state["data"])
        self.source.load_state_dict(state.get("rollout_source"), step)
