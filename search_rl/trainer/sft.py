"""``SFTStep``: the warm start's supervised step, run by the same ``TrainingLoop`` as RL.

One step: the next batch of warm-start examples (``SFTDataset`` through the resumable ``PromptLoader``) → one
optimizer step of masked next-token log-likelihood on the actor workers (``ActorRolloutRefWorker.update_sft``) →
weight sync. Validation is the loop's own (greedy rollouts with search, EM / F1 / answer rate / searches per data
source), and checkpoints are the same ``global_step_N`` folders, so ``main_ppo model.path=<checkpoint>`` starts RL
from one and ``main_eval`` scores one.
"""

from __future__ import annotations

from typing import Any

from search_rl.batches import TrainBatch
from search_rl.prompt_data import PromptLoader
from search_rl.tracking import timer
from search_rl.trainer.collect import sync_actor_engines
from search_rl.trainer.metrics import mean_worker_metrics, throughput_metrics
from search_rl.workers import Workers
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker


class SFTStep:
    """One supervised step over ``train_data`` (a ``PromptLoader`` over an ``SFTDataset``)."""

    def __init__(self, actor: Workers[ActorRolloutRefWorker], train_data: PromptLoader) -> None:
        self.actor, self.train_data = actor, train_data

    def run(self, step: int) -> dict[str, float]:
        """Batch → ``update_sft`` on the workers → weight sync; returns the step's metrics."""
        m: dict[str, float] = {}
        with timer("step", m):
            batch: TrainBatch = self.train_data.next_batch()
            with timer("update_actor", m):
                m.update(mean_worker_metrics(self.actor.map_shards(ActorRolloutRefWorker.update_sft, batch)))
            with timer("sync_weights", m):
                sync_actor_engines(self.actor, step)
        loader = self.train_data
        m["train/epoch"] = loader.epoch + loader.batches_taken / max(loader.batches_per_epoch, 1)
        m["response_length/model_tokens_mean"] = float(batch.response_mask.sum()) / len(batch)
        m["response_length/mean"] = float(batch.response_attention_mask.sum()) / len(batch)
        throughput_metrics(m, batch)
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.train_data.state_dict(), "rollout_source": None, "kl_ctrl": None}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.train_data.load_state_dict(state["data"])
