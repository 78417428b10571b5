"""``PPOTrainer``: the single-controller training loop (PPO with a critic, GRPO and the other critic-free estimators).

The driver owns the data and the loop; the worker groups own the models. One step::

    prompts ─► rollout (search) ─► reward ─► old log-probs ─► ref log-probs ─► values ─► advantages
            ─► critic update ─► actor update ─► weight sync (versioned) ─► dump, validate, checkpoint, log

The collect half of a step (rollout, rewards, collation; dynamic sampling; the asynchronous modes' source) is
``collect.RolloutPhases``; this module has the loop, the learn half, validation and checkpoints.

Everything the loop needs is injected (``main_ppo.build_trainer`` constructs it), so tests can hand it local
workers. Randomness is derived from ``(trainer.seed, step)``: sampling seeds, shuffles and the data order, so a run
resumed from a checkpoint reproduces the uninterrupted run's next steps on CPU.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

from search_rl.algorithms import build_kl_controller
from search_rl.algorithms.masked import masked_mean
from search_rl.checkpoint import TRAINER_STATE, CheckpointManager
from search_rl.collect import Collected, RetrieverOutage, RolloutPhases, RolloutSource, Workers, _step_seed
from search_rl.config import AlgorithmConfig, StepSettings, TrainerConfig
from search_rl.data import PromptLoader
from search_rl.datatypes import RewardResult, RolloutResult, Trajectory
from search_rl.protocol import PromptBatch, TrainBatch
from search_rl.scoring import answer_metrics, score_trajectories
from search_rl.steps import compute_advantages, old_logprob_source
from search_rl.tracking import RolloutDumper, Tracker, timer

__all__ = [
    "Collected",
    "PPOTrainer",
    "RetrieverOutage",
    "RolloutSource",
    "Workers",
    "_step_seed",
    "mean_worker_metrics",
]

logger = logging.getLogger(__name__)


class PPOTrainer(RolloutPhases):
    """The loop. ``fit()`` runs it from the latest checkpoint (or the start) to ``trainer.total_training_steps``.

    Args:
        cfg: loop length, schedule, resume policy.
        algo: the RL objective.
        settings: padding, widths, which optional phases run, scoring.
        actor: ``ActorRolloutRefWorker`` group.
        critic: ``CriticWorker`` group, or None for critic-free estimators.
        train_data: the resumable prompt loader.
        val_data: validation prompts, or None.
        tracker: metric sinks.
        checkpoints: checkpoint folder manager.
        dumper: rollout dump writer, or None.
        source: the asynchronous modes' rollouts (generators), or None for ``sync``.
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        algo: AlgorithmConfig,
        settings: StepSettings,
        *,
        actor: Workers,
        critic: Workers | None,
        train_data: PromptLoader,
        val_data: PromptBatch | None,
        tracker: Tracker,
        checkpoints: CheckpointManager,
        dumper: RolloutDumper | None,
        source: RolloutSource | None = None,
    ) -> None:
        self.cfg, self.algo, self.settings = cfg, algo, settings
        self.actor, self.critic = actor, critic
        self.train_data, self.val_data = train_data, val_data
        self.tracker, self.checkpoints, self.dumper = tracker, checkpoints, dumper
        self.kl_ctrl = build_kl_controller(algo) if algo.use_kl_in_reward else None
        self.source = source
        self.step = 0
        self.old_source = "recompute"  # of the batch being trained on (``compute_old_logprobs``)

    # --- the loop ----------------------------------------------------------------------------------------------

    def fit(self) -> list[tuple[int, dict[str, float]]]:
        """Train to ``total_training_steps``; returns the logged history ``[(step, metrics), ...]``."""
        self.resume()
        if self.cfg.val_before_train and self.step == 0 and self.val_data is not None:
            self.tracker.log(self.validate(), step=0)
        while self.step < self.cfg.total_training_steps:
            self.step += 1
            metrics = self.train_step()
            if self._due(self.cfg.test_freq) and self.val_data is not None:
                with timer("validate", metrics):
                    metrics.update(self.validate())
            if self._due(self.cfg.save_freq):
                self.save(metrics)
            else:
                self.tracker.log(metrics, self.step)
        return self.tracker.history

    def train_step(self) -> dict[str, float]:
        """One step: collect a scored batch (``collect``), then learn from it (``learn``)."""
        m: dict[str, float] = {}
        with timer("step", m):
            collected = self.collect(m) if self.source is None else self.collect_async(m)
            batch = self.learn(collected, m)
            self.dump(
                "train", collected.prompts, collected.trajectories, collected.results, batch, batch.meta.weight_version
            )
        self._throughput(m, batch)
        return m

    def learn(self, collected: Collected, m: dict[str, float]) -> TrainBatch:
        """Log-probs → values → advantages → critic and actor updates → weight sync; returns the trained batch."""
        batch, prompts = collected.batch, collected.prompts
        with timer("old_log_prob", m):
            batch = self.compute_old_logprobs(batch, m)
        if self.settings.use_reference:
            with timer("ref_log_prob", m):
                batch = self.compute_ref_logprobs(batch)
        if self.critic is not None:
            with timer("values", m):
                batch = self.compute_values(batch)
        with timer("advantages", m):
            batch = self.compute_advantages(batch, prompts, m)
        if self.critic is not None:
            with timer("update_critic", m):
                m.update(self.update_critic(batch))
        if self.step <= self.cfg.critic_warmup:  # the critic learns first: the policy and the engines stay as they are
            m["critic/warmup"] = 1.0
            return batch
        with timer("update_actor", m):
            m.update(self.update_actor(batch))
        with timer("sync_weights", m):
            self.sync_weights()
        return batch

    # --- phases ------------------------------------------------------------------------------------------------

    def compute_old_logprobs(self, batch: TrainBatch, metrics: dict[str, float]) -> TrainBatch:
        """The PPO ratio's old log-probs, from where ``steps.old_logprob_source`` says: recomputed under the
        current weights, the engine's sampling log-probs, or none (``current``: the update uses its own)."""
        source = old_logprob_source(
            self.settings.old_logprobs,
            fresh=batch.meta.weight_version == self.step - 1,
            on_policy_update=self.settings.on_policy_update,
            engine_matches_trainer=self.settings.engine_matches_trainer,
            needed_before_update=self.algo.use_kl_in_reward,
        )
        self.old_source = source
        metrics["actor/old_logprobs_recomputed"] = float(source == "recompute")
        if source == "current":
            return batch
        if source == "rollout":
            return batch.replace(old_logprobs=batch.rollout_logprobs)
        parts = self.actor.map_shards("compute_log_prob", batch)
        old = torch.cat([lp for lp, _ in parts])  # (B, T)
        entropy = torch.cat([ent for _, ent in parts])  # (B, T)
        mask = batch.response_mask
        metrics["actor/entropy_rollout"] = masked_mean(entropy, mask).item()
        metrics["rollout/logprob_abs_diff"] = masked_mean((old - batch.rollout_logprobs).abs(), mask).item()
        return batch.replace(old_logprobs=old)

    def compute_ref_logprobs(self, batch: TrainBatch) -> TrainBatch:
        return batch.replace(ref_logprobs=torch.cat(self.actor.map_shards("compute_ref_log_prob", batch)))

    def compute_values(self, batch: TrainBatch) -> TrainBatch:
        assert self.critic is not None
        return batch.replace(values=torch.cat(self.critic.map_shards("compute_values", batch)))

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
        results = self.actor.map_shards("generate", unique, greedy=True, seed=0)
        trajectories = [t for r in results for t in r.trajectories]
        scores = score_trajectories(trajectories, unique, self.settings.reward, self.settings.response_width)
        by_uid = {uid: s.score for uid, s in zip(unique.uids, scores, strict=True)}
        return torch.tensor([by_uid[u] for u in prompts.uids], dtype=torch.float32)

    def update_critic(self, batch: TrainBatch) -> dict[str, float]:
        assert self.critic is not None
        return mean_worker_metrics(self.critic.map_shards("update_critic", batch, step=self.step))

    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        on_policy = self.old_source == "current"
        return mean_worker_metrics(self.actor.map_shards("update_actor", batch, step=self.step, on_policy=on_policy))

    def sync_weights(self) -> None:
        """Push the new weights to the rollout engines, versioned by the step that produced them (the asynchronous
        modes publish them for the generators to pull: ``RolloutSource.publish``)."""
        if self.source is not None:
            self.source.publish(self.step)
            return
        versions = self.actor.broadcast("sync_weights", self.step)
        if set(versions) != {self.step}:
            raise RuntimeError(f"weight sync: engines report versions {versions}, expected {self.step}")

    def validate(self) -> dict[str, float]:
        """Greedy rollouts of the validation prompts; EM / sub-EM / F1, answer rate, searches per data source."""
        assert self.val_data is not None
        results: list[RolloutResult] = self.actor.map_shards("generate", self.val_data, greedy=True, seed=0)
        trajectories = [t for r in results for t in r.trajectories]
        scores = score_trajectories(trajectories, self.val_data, self.settings.reward, self.settings.response_width)
        self.dump("val", self.val_data, trajectories, scores, None, self.step)
        return answer_metrics(trajectories, scores, self.val_data.data_sources, "val", self.val_data.targets)

    def dump(
        self,
        kind: str,
        prompts: PromptBatch,
        trajectories: list[Trajectory],
        results: list[RewardResult],
        batch: TrainBatch | None,
        weight_version: int,
    ) -> None:
        if self.dumper is None or not self.cfg.dump_rollouts:
            return
        advantages = None
        if batch is not None and batch.advantages is not None and batch.loss_mask is not None:
            advantages = masked_mean(batch.advantages, batch.loss_mask, dim=-1).tolist()
        self.dumper.dump(kind, self.step, prompts, trajectories, results, advantages, weight_version)

    # --- checkpoints -------------------------------------------------------------------------------------------

    def save(self, metrics: dict[str, float]) -> None:
        """Checkpoint the workers' models and optimizers and the loop's state, atomically, and log the step.

        The step's metrics are logged after the files are written and before the checkpoint is committed (renamed
        into place): a crash in between leaves the previous checkpoint, from which the resumed run redoes the step
        (its line is rewound), and a committed checkpoint always has its step's line in ``metrics.jsonl``.
        """
        with self.checkpoints.writing(self.step) as directory:
            with timer("save", metrics):
                self.actor.broadcast("save_checkpoint", str(directory))
                if self.critic is not None:
                    self.critic.broadcast("save_checkpoint", str(directory))
                torch.save(self.state_dict(), directory / TRAINER_STATE)
            self.tracker.log(metrics, self.step)

    def resume(self) -> None:
        """Continue from the checkpoint ``trainer.resume`` names (latest for ``auto``), if any.

        Metrics and rollout dumps of steps after the starting point (all of them on a fresh start) are dropped, so
        the run folder always reads as one run.
        """
        path = self.checkpoints.resolve(self.cfg.resume)
        if path is None:
            self._rewind_outputs()
            return
        self.actor.broadcast("load_checkpoint", str(path))
        if self.critic is not None:
            self.critic.broadcast("load_checkpoint", str(path))
        self.load_state_dict(torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=False))
        self.actor.broadcast("sync_weights", self.step)
        self._rewind_outputs()
        logger.info("resumed from %s at step %d", path, self.step)

    def _rewind_outputs(self) -> None:
        self.tracker.rewind(self.step)
        if self.dumper is not None:
            self.dumper.rewind(self.step)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "data": self.train_data.state_dict() if self.source is None else self.source.data_state_dict(),
            "rollout_source": self.source.state_dict() if self.source is not None else None,
            "kl_ctrl": self.kl_ctrl.state_dict() if self.kl_ctrl is not None else None,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.train_data.load_state_dict(state["data"])
        if self.source is not None:  # what was queued or in flight is dropped; its prompts are drawn again
            self.source.load_state_dict(state.get("rollout_source"), self.step)
        if self.kl_ctrl is not None and state["kl_ctrl"] is not None:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])

    # --- helpers -----------------------------------------------------------------------------------------------

    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.cfg.total_training_steps)

    @staticmethod
    def _throughput(m: dict[str, float], batch: TrainBatch) -> None:
        tokens = float(batch.attention_mask.sum())
        m["perf/total_tokens"] = tokens
        m["perf/tokens_per_s"] = tokens / max(m["timing/step_s"], 1e-9)
        if "perf/actor_update_tokens" in m:
            m["perf/actor_update_tokens_per_s"] = m["perf/actor_update_tokens"] / max(m["timing/update_actor_s"], 1e-9)


def mean_worker_metrics(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Mean over workers of each metric; ``perf/*`` token counts are summed."""
    keys = sorted({k for d in dicts for k in d})
    out = {}
    for k in keys:
        values = [d[k] for d in dicts if k in d]
        out[k] = sum(values) if k.startswith("perf/") else sum(values) / len(values)
    return out
