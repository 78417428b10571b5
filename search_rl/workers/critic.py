"""``CriticWorker``: the value model (the policy's backbone with a scalar head) on one data-parallel rank.

Methods called by the driver through ``WorkerGroup``: ``compute_values(batch)`` and ``update_critic(batch, step)``
(PPO's clipped value loss on the batch's ``loss_mask``, the same mini/micro-batch loop as the actor), plus
``save_checkpoint`` / ``load_checkpoint``. Used only when the advantage estimator reads values (``gae``).
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

from search_rl.algorithms import compute_value_loss
from search_rl.batches import TrainBatch
from search_rl.config import AlgorithmConfig, CriticConfig, ModelConfig
from search_rl.models.compute_dtype import compute_dtype_on
from search_rl.models.trainer_attention import use_trainer_attention
from search_rl.models.value_head import ValueModel, build_value_model
from search_rl.workers import distributed as D
from search_rl.workers.forward import model_token_count, response_values
from search_rl.workers.optimization import TrainableModel


def critic_loss(
    micro: TrainBatch, values: torch.Tensor, algo: AlgorithmConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss of one micro-batch on its ``loss_mask``."""
    micro.require("loss_mask", "values", "returns")
    assert micro.loss_mask is not None and micro.values is not None and micro.returns is not None
    device = values.device
    return compute_value_loss(
        values, micro.values.to(device), micro.returns.to(device), micro.loss_mask.to(device), algo
    )


class CriticWorker:
    """Value model on one rank.

    Args:
        spec: rank, world size, device, threads, seed.
        model: the policy source the backbone is taken from.
        critic: update settings.
        algorithm: value clip and loss aggregation.
        n_samples: samples per prompt (mini-batches are counted in prompts).
    """

    def __init__(
        self, spec: D.WorkerSpec, model: ModelConfig, critic: CriticConfig, algorithm: AlgorithmConfig, n_samples: int
    ) -> None:
        D.setup_worker_process(spec)
        self.spec, self.cfg, self.algo, self.n_samples = spec, critic, algorithm, n_samples
        self.compute_dtype = compute_dtype_on(model.dtype, spec.torch_device)  # auto: for this worker's device
        # fp32 master weights; forward/backward in the compute dtype (see workers.distributed)
        self.value_model: ValueModel = build_value_model(model.path, dtype=torch.float32, seed=model.seed)
        use_trainer_attention([self.value_model.backbone], model.attn_implementation)
        if model.gradient_checkpointing:
            self.value_model.backbone.gradient_checkpointing_enable()
        self.module: torch.nn.Module = self.value_model
        self.trainable: TrainableModel | None = None

    def master_address(self) -> tuple[str, int]:
        return D.master_address()

    def init_distributed(self, host: str, port: int) -> None:
        """Join the process group, shard the value model, build the optimizer."""
        D.init_process_group(self.spec, host, port)
        self.module = D.shard(self.value_model, self.spec, self.compute_dtype)
        self.trainable = TrainableModel(self.module, self.cfg.optim, self.cfg.grad_clip, self.spec, "critic")

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """Values at every response position; (B, T). Every rank must call it (sharded forwards)."""
        self.module.eval()
        parts = []
        with torch.no_grad():
            for part, real in D.matched_passes(
                batch.split_by_size(self.cfg.forward_micro_batch_size_per_gpu), self.spec
            ):
                values = response_values(self.module, part).cpu()
                if real:
                    parts.append(values)
        return torch.cat(parts)

    def update_critic(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """PPO value update on this worker's shard; returns mean ``critic/*`` metrics."""
        assert self.trainable is not None
        mini = self.cfg.ppo_mini_batch_size * self.n_samples // self.spec.world_size

        def loss_fn(micro: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
            return critic_loss(micro, response_values(self.module, micro), self.algo)

        metrics = self.trainable.ppo_update(
            batch,
            loss_fn,
            mini_batch_size=mini,
            micro_batch_size=self.cfg.ppo_micro_batch_size_per_gpu,
            epochs=self.cfg.ppo_epochs,
            shuffle_seed=None,
            loss_agg_mode=self.algo.loss_agg_mode,
        )
        metrics["perf/critic_update_tokens"] = float(model_token_count(batch) * self.cfg.ppo_epochs)
        D.release_memory()
        return metrics

    def save_checkpoint(self, directory: str) -> None:
        """Rank 0 writes ``critic/model.safetensors`` and ``critic_optim.pt``, unsharded (any rank count resumes)."""
        assert self.trainable is not None
        path = Path(directory)
        state = D.full_state_dict(self.module, rank0_only=True)
        self.trainable.save_optimizer(path / "critic_optim.pt")
        if self.spec.rank == 0:
            from safetensors.torch import save_file

            (path / "critic").mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous().cpu() for k, v in state.items()}, str(path / "critic" / "model.safetensors"))

    def load_checkpoint(self, directory: str) -> None:
        """Load what ``save_checkpoint`` wrote."""
        assert self.trainable is not None
        from safetensors.torch import load_file

        path = Path(directory)
        D.load_full_state_dict(self.module, load_file(str(path / "critic" / "model.safetensors")))
        self.trainable.load_optimizer(path / "critic_optim.pt")

    def peak_memory_mb(self) -> float:
        """Peak resident memory of this worker process, in MiB."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
