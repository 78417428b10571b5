"""``RunDumper``: a training run's rollout dumps (``trainer.dump_rollouts``), with each sample's mean advantage."""

from __future__ import annotations

from search_rl.algorithms.masked import masked_mean
from search_rl.batches import PromptBatch, TrainBatch
from search_rl.datatypes import RewardResult, Trajectory
from search_rl.tracking import RolloutDumper


class RunDumper:
    """Writes a step's rollouts with their advantages (``trainer.dump_rollouts``; None: dumps are off)."""

    def __init__(self, dumper: RolloutDumper | None) -> None:
        self.dumper = dumper

    def dump(
        self,
        kind: str,
        step: int,
        prompts: PromptBatch,
        trajectories: list[Trajectory],
        results: list[RewardResult],
        batch: TrainBatch | None,
        weight_version: int,
    ) -> None:
        if self.dumper is None:
            return
        advantages = None
        if batch is not None and batch.advantages is not None and batch.loss_mask is not None:
            advantages = masked_mean(batch.advantages, batch.loss_mask, dim=-1).tolist()
        self.dumper.dump(kind, step, prompts, trajectories, results, advantages, weight_version)

    def rewind(self, step: int) -> None:
        """Drop the dumps of steps after ``step`` (a resumed run redoes them)."""
        if self.dumper is not None:
            self.dumper.rewind(step)
