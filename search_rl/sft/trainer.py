"""``SFTTrainer``: the warm-start loop — the RL trainer's loop, validation, checkpoints and metrics, with a supervised
step in place of rollout → reward → advantages → PPO update.

One step: the next batch of warm-start examples (``SFTDataset`` through the resumable ``PromptLoader``) → one
optimizer step of masked next-token log-likelihood on the actor workers (``ActorRolloutRefWorker.update_sft``) →
weight sync. Validation is the RL trainer's own (greedy rollouts with search, EM / F1 / answer rate / searches per
data source), and checkpoints are the same ``global_step_N`` folders, so ``main_ppo model.path=<checkpoint>`` starts
RL from one and ``main_eval`` scores one.
"""

from __future__ import annotations

from search_rl.protocol import TrainBatch
from search_rl.tracking import timer
from search_rl.trainer import PPOTrainer, mean_worker_metrics


class SFTTrainer(PPOTrainer):
    """``PPOTrainer`` whose step is supervised. Construct it with ``critic=None`` and a ``PromptLoader`` over an
    ``SFTDataset`` as ``train_data`` (see ``main_sft.build_trainer``)."""

    def train_step(self) -> dict[str, float]:
        """One supervised step: batch → ``update_sft`` on the workers → weight sync."""
        m: dict[str, float] = {}
        with timer("step", m):
            batch: TrainBatch = self.train_data.next_batch()
            with timer("update_actor", m):
                m.update(mean_worker_metrics(self.actor.map_shards("update_sft", batch)))
            with timer("sync_weights", m):
                self.sync_weights()
        loader = self.train_data
        m["train/epoch"] = loader.epoch + loader.batches_taken / max(loader.batches_per_epoch, 1)
        m["response_length/model_tokens_mean"] = float(batch.response_mask.sum()) / len(batch)
        m["response_length/mean"] = float(batch.response_attention_mask.sum()) / len(batch)
        self._throughput(m, batch)
        return m
