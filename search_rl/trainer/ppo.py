"""``PPOStep``: one RL step (PPO with a critic, GRPO and the other critic-free estimators).

::

    collector.collect ─► old log-probs ─► ref log-probs ─► values ─► advantages
        ─► critic update ─► actor update ─► collector.sync_weights (versioned) ─► dump

Where the rollouts come from (lock-step or the asynchronous generators) and how new weights reach the engines is the
``Collector``'s business (``trainer/collect.py``); this module is the learn half. ``TrainingLoop``
(``trainer/loop.py``) runs it, with validation and checkpoints. Everything is injected (``main_ppo`` builds it), so
tests can hand it local workers.
"""

from __future__ import annotations

from typing import Any

import torch

from search_rl.algorithms import build_kl_controller
from search_rl.algorithms.masked import masked_mean
from search_rl.batches import PromptBatch, TrainBatch
from search_rl.config import AlgorithmConfig, StepSettings
from search_rl.reward.health import trajectory_health
from search_rl.reward.scoring import score_trajectories
from search_rl.tracking import timer
from search_rl.trainer.collect import Collected, Collector
from search_rl.trainer.dump import RunDumper
from search_rl.trainer.metrics import mean_worker_metrics, throughput_metrics
from search_rl.trainer.steps import compute_advantages, old_logprob_source
from search_rl.workers import Workers
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
from search_rl.workers.critic import CriticWorker


class PPOStep:
    """One RL step: collect a scored batch, then learn from it.

    Args:
        algo: the RL objective.
        settings: padding, widths, which optional phases run, scoring.
        actor: ``ActorRolloutRefWorker`` group.
        critic: ``CriticWorker`` group, or None for critic-free estimators.
        collector: where the step's rollouts come from (``SyncCollector`` or ``AsyncCollector``).
        dumper: rollout dumps.
        critic_warmup: steps in which only the critic learns (``trainer.critic_warmup``).
    """

    def __init__(
        self,
        algo: AlgorithmConfig,
        settings: StepSettings,
        *,
        actor: Workers[ActorRolloutRefWorker],
        critic: Workers[CriticWorker] | None,
        collector: Collector,
        dumper: RunDumper,
        critic_warmup: int = 0,
    ) -> None:
        self.algo, self.settings = algo, settings
        self.actor, self.critic, self.collector, self.dumper = actor, critic, collector, dumper
        self.critic_warmup = critic_warmup
        self.kl_ctrl = build_kl_controller(algo) if algo.use_kl_in_reward else None
        self.step = 0
        self.old_source = "recompute"  # of the batch being trained on (``compute_old_logprobs``)

    def run(self, step: int) -> dict[str, float]:
        """One step: collect a scored batch, then learn from it (``learn``); returns the step's metrics."""
        self.step = step
        m: dict[str, float] = {}
        with timer("step", m):
            c = self.collector.collect(step, m)
            batch = self.learn(c, m)
            m.update(trajectory_health(c.trajectories))
            self.dumper.dump("train", step, c.prompts, c.trajectories, c.results, batch, batch.meta.weight_version)
        throughput_metrics(m, batch)
        return m

    def learn(self, collected: Collected, m: dict[str, float]) -> TrainBatch:
        """Log-probs → values → advantages → critic and actor updates → weight sync; returns the trained batch."""
        batch, prompts = collected.batch, collected.prompts
        with timer("old_log_prob", m):
            batch = self.compute_old_logprobs(batch, m)
        if self.settings.use_reference:
            with timer("ref_log_prob", m):
                batch = batch.replace(
                    ref_logprobs=torch.cat(self.actor.map_shards(ActorRolloutRefWorker.compute_ref_log_prob, batch))
                )
        if self.critic is not None:
            with timer("values", m):
                batch = batch.replace(values=torch.cat(self.critic.map_shards(CriticWorker.compute_values, batch)))
        with timer("advantages", m):
            batch = self.compute_advantages(batch, prompts, m)
        if self.critic is not None:
            with timer("update_critic", m):
                m.update(mean_worker_metrics(self.critic.map_shards(CriticWorker.update_critic, batch, step=self.step)))
        if self.step <= self.critic_warmup:  # the critic learns first: the policy and the engines stay as they are
            m["critic/warmup"] = 1.0
            return batch
        with timer("update_actor", m):
            m.update(self.update_actor(batch))
        with timer("sync_weights", m):
            self.collector.sync_weights(self.step)
        return batch

    def compute_old_logprobs(self, batch: TrainBatch, metrics: dict[str, float]) -> TrainBatch:
        """The PPO ratio's old log-probs, from where ``steps.old_logprob_source`` says: recomputed under the
        current weights, the engine's sampling log-probs, or none (``current``: the update uses its own)."""
        source = old_logprob_source(
            self.settings.old_logprobs,
            fresh=batch.meta.weight_version == self.step - 1,
            on_policy_update=self.settings.on_policy_update,
            engine_matches_trainer=self.settings.engine_matches_trainer,
            needed_before_update=self.algo.use_kl_in_reward,
            one_epoch=self.settings.one_epoch_update,
        )
        self.old_source = source
        metrics["actor/old_logprobs_recomputed"] = float(source in ("recompute", "update"))
        if source in ("current", "update"):  # the update computes them (``ActorRolloutRefWorker.update_actor``)
            return batch
        if source == "rollout":
            return batch.replace(old_logprobs=batch.rollout_logprobs)
        parts = self.actor.map_shards(ActorRolloutRefWorker.compute_log_prob, batch)
        old = torch.cat([lp for lp, _ in parts])  # (B, T)
        entropy = torch.cat([ent for _, ent in parts])  # (B, T)
        mask = batch.response_mask
        metrics["actor/entropy_rollout"] = masked_mean(entropy, mask).item()
        metrics["rollout/logprob_abs_diff"] = masked_mean((old - batch.rollout_logprobs).abs(), mask).item()
        return batch.replace(old_logprobs=old)

    def compute_advantages(self, batch: TrainBatch, prompts: PromptBatch, metrics: dict[str, float]) -> TrainBatch:
        """Mask, KL-in-reward and the configured estimator (``steps.compute_advantages``)."""
        baselines = self._greedy_baselines(prompts) if self.settings.greedy_baseline else None
        batch, adv_metrics = compute_advantages(batch, self.algo, self.kl_ctrl, baselines)
        metrics.update(adv_metrics)
        return batch

    def _greedy_baselines(self, prompts: PromptBatch) -> torch.Tensor:
        """(B,) reward of each prompt's greedy rollout (ReMax's baseline), one rollout per distinct prompt."""
        first = {uid: i for i, uid in reversed(list(enumerate(prompts.uids)))}
        unique = prompts.select(sorted(first.values()))
        results = self.actor.map_shards(ActorRolloutRefWorker.generate, unique, greedy=True, seed=0)
        trajectories = [t for r in results for t in r.trajectories]
        scores = score_trajectories(trajectories, unique, self.settings.reward, self.settings.response_width)
        by_uid = {uid: s.score for uid, s in zip(unique.uids, scores, strict=True)}
        return torch.tensor([by_uid[u] for u in prompts.uids], dtype=torch.float32)

    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        old_source = self.old_source if self.old_source in ("current", "update") else "batch"
        parts = self.actor.map_shards(ActorRolloutRefWorker.update_actor, batch, step=self.step, old_source=old_source)
        return mean_worker_metrics(parts)

    def state_dict(self) -> dict[str, Any]:
        return {**self.collector.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict() if self.kl_ctrl else None}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.step = step
        self.collector.load_state_dict(state, step)
        if self.kl_ctrl is not None and state["kl_ctrl"] is not None:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
