"""``TrainingLoop``: the one loop of every trainer (PPO, GRPO and the other estimators, and the SFT warm start).

It owns what every trainer shares: the step counter, validation (greedy rollouts with search), checkpoints and
resume, metric logging and the output rewind of a resumed run. What one step does is a ``Step`` handed in:
``PPOStep`` (``trainer/ppo.py``) or ``SFTStep`` (``trainer/sft.py``)::

    resume ─► [validate] ─► for step in 1..N:  step.run(step) ─► [validate] ─► save | log

Randomness is derived from ``(trainer.seed, step)`` (``search_rl/seeds.py``) and the RNG states are checkpointed,
so a run resumed from a checkpoint reproduces the uninterrupted run's next steps on CPU.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from search_rl.batches import PromptBatch
from search_rl.config import RewardConfig, TrainerConfig
from search_rl.reward.health import HealthMonitor
from search_rl.reward.scoring import answer_metrics, score_trajectories
from search_rl.state_files import load_state, numpy_rng_state, set_numpy_rng_state
from search_rl.tracking import Tracker, timer
from search_rl.trainer.checkpoint import TRAINER_STATE, CheckpointManager
from search_rl.trainer.collect import sync_actor_engines
from search_rl.trainer.dump import RunDumper
from search_rl.workers import Workers
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
from search_rl.workers.critic import CriticWorker

logger = logging.getLogger(__name__)

History = list[tuple[int, dict[str, float]]]
"""``(step, metrics)`` of every logged step."""


class Step(Protocol):
    """One training step of a trainer (``PPOStep``, ``SFTStep``) and the state it carries across a resume."""

    def run(self, step: int) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], step: int) -> None: ...


@dataclass
class Validation:
    """What validation rolls out and how it is scored."""

    prompts: PromptBatch
    reward: RewardConfig
    response_width: int


class TrainingLoop:
    """``fit()`` runs ``step`` from the latest checkpoint (or the start) to ``trainer.total_training_steps``.

    Args:
        cfg: loop length, validation and save schedule, resume policy.
        step: what one step does.
        actor: the actor group (validation rollouts, checkpoints, engine sync after a resume).
        critic: the critic group, or None.
        validation: validation prompts and scoring, or None.
        tracker: metric sinks.
        checkpoints: checkpoint folder manager.
        dumper: rollout dumps.
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        step: Step,
        *,
        actor: Workers[ActorRolloutRefWorker],
        critic: Workers[CriticWorker] | None,
        validation: Validation | None,
        tracker: Tracker,
        checkpoints: CheckpointManager,
        dumper: RunDumper,
    ) -> None:
        self.cfg, self.step_fn, self.actor, self.critic = cfg, step, actor, critic
        self.validation, self.tracker, self.checkpoints, self.dumper = validation, tracker, checkpoints, dumper
        self.step = 0
        self.health = HealthMonitor(cfg.health) if cfg.health.enabled else None

    def fit(self) -> History:
        """Train to ``total_training_steps``; returns the logged history ``[(step, metrics), ...]``."""
        self.resume()
        if self.cfg.val_before_train and self.step == 0 and self.validation is not None:
            self.tracker.log(self.validate(), step=0)
        while self.step < self.cfg.total_training_steps:
            self.step += 1
            metrics = self.step_fn.run(self.step)
            if self._due(self.cfg.test_freq) and self.validation is not None:
                with timer("validate", metrics):
                    metrics.update(self.validate())
            stop = self.stop_signals(metrics)
            if self._due(self.cfg.save_freq) or stop:
                self.save(metrics)
            else:
                self.tracker.log(metrics, self.step)
            if stop:
                logger.error("stopping at step %d on %s (trainer.stop_on); checkpoint saved", self.step, stop)
                break
        return self.tracker.history

    def stop_signals(self, metrics: dict[str, float]) -> list[str]:
        """The step's health warnings (``reward/health.py``, flags added to ``metrics``) that ``trainer.stop_on``
        names."""
        warnings = self.health.check(metrics, self.step) if self.health is not None else []
        return [w.signal for w in warnings if w.signal in self.cfg.stop_on]

    def validate(self) -> dict[str, float]:
        """Greedy rollouts of the validation prompts; EM / sub-EM / F1, answer rate, searches per data source."""
        assert self.validation is not None
        v = self.validation
        results = self.actor.map_shards(ActorRolloutRefWorker.generate, v.prompts, greedy=True, seed=0)
        trajectories = [t for r in results for t in r.trajectories]
        scores = score_trajectories(trajectories, v.prompts, v.reward, v.response_width)
        self.dumper.dump("val", self.step, v.prompts, trajectories, scores, None, self.step)
        return answer_metrics(trajectories, scores, v.prompts.data_sources, "val", v.prompts.targets)

    def save(self, metrics: dict[str, float]) -> None:
        """Checkpoint the workers' models and optimizers and the loop's state, atomically, and log the step.

        The step's metrics are logged after the files are written and before the checkpoint is committed (renamed
        into place): a crash in between leaves the previous checkpoint, from which the resumed run redoes the step
        (its line is rewound), and a committed checkpoint always has its step's line in ``metrics.jsonl``.
        """
        with self.checkpoints.writing(self.step) as directory:
            with timer("save", metrics):
                self.actor.broadcast(ActorRolloutRefWorker.save_checkpoint, str(directory))
                if self.critic is not None:
                    self.critic.broadcast(CriticWorker.save_checkpoint, str(directory))
                torch.save(self.state_dict(), directory / TRAINER_STATE)
            self.tracker.log(metrics, self.step)

    def resume(self) -> None:
        """Continue from the checkpoint ``trainer.resume`` names (latest for ``auto``), if any.

        Metrics and rollout dumps of steps after the starting point (all of them on a fresh start) are dropped, so
        the run folder always reads as one run.
        """
        path = self.checkpoints.resolve(self.cfg.resume)
        if path is not None:
            self.actor.broadcast(ActorRolloutRefWorker.load_checkpoint, str(path))
            if self.critic is not None:
                self.critic.broadcast(CriticWorker.load_checkpoint, str(path))
            self.load_state_dict(load_state(path / TRAINER_STATE))
            sync_actor_engines(self.actor, self.step)
            logger.info("resumed from %s at step %d", path, self.step)
        self.tracker.rewind(self.step)
        self.dumper.rewind(self.step)

    def state_dict(self) -> dict[str, Any]:
        """The step counter, RNG states, the health monitor's history and the step's own state (data position, rollout
        source, KL controller)."""
        # plain types only: the file is read with weights_only=True (search_rl.state_files)
        rng = {"python": random.getstate(), "numpy": numpy_rng_state(), "torch": torch.get_rng_state()}
        health = self.health.history if self.health is not None else None  # a resumed run keeps its baselines
        return {"step": self.step, **self.step_fn.state_dict(), "rng": rng, "health": health}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.step_fn.load_state_dict(state, self.step)
        if self.health is not None:
            self.health.history = {k: list(v) for k, v in (state.get("health") or {}).items()}
        random.setstate(state["rng"]["python"])
        set_numpy_rng_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])

    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.cfg.total_training_steps)
