"""``ActorRolloutRefWorker``: the policy (trained), its generation engine with the search loop, and the reference.

One process per data-parallel rank (a Ray actor, made by ``WorkerGroup``). It owns the weights; the driver owns the
loop and calls the typed methods below through ``WorkerGroup.broadcast`` / ``map_shards``:

- ``generate(prompts, greedy, seed)``: multi-turn search rollouts of its shard (``LLMGenerationManager``).
- ``compute_log_prob(batch)`` / ``compute_ref_log_prob(batch)``: log-probs under the current / reference policy.
- ``update_actor(batch, step)``: PPO epochs over mini/micro-batches with the masked actor loss.
- ``update_sft(batch)``: one optimizer step of masked next-token log-likelihood (the warm start, ``main_sft``).
- ``sync_weights(version)``: push the trained weights to the rollout engine, recording their version.
- ``save_checkpoint(dir)`` / ``load_checkpoint(dir)``.

The policy is sharded with FSDP2 on every device (``workers.distributed``): fp32 master weights, forward/backward in
the compute dtype ``model.dtype`` (``auto`` resolved by the config, or here for this worker's device when the config
could not: ``models.compute_dtype``). The engine (HF, static, vLLM) has its own full copy in the compute dtype; a sync
gathers the full state dict and loads it into the engine (``RolloutEngine.update_weights``), tied tensors once
under their canonical name (found by identity, ``models.weights``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from search_rl.algorithms import compute_actor_loss, loss_mask_for
from search_rl.batches import PromptBatch, TrainBatch
from search_rl.config import (
    ActorConfig,
    AlgorithmConfig,
    ModelConfig,
    RefConfig,
    RetrieverClientConfig,
    TrainRolloutConfig,
)
from search_rl.datatypes import RolloutResult
from search_rl.models import load_model, load_tokenizer
from search_rl.models.compute_dtype import compute_dtype_on
from search_rl.models.lora import (
    ADAPTER_DIR,
    adapter_state_dict,
    apply_lora,
    load_adapters,
    lora_scaling,
    merged_state_dict,
    reference_forward,
    save_adapters,
)
from search_rl.models.trainer_attention import use_trainer_attention
from search_rl.models.weights import save_hf_folder, tensor_aliases, without_aliases
from search_rl.rollout.assembly import build_rollout
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.factory import MODEL_ENGINES
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.seeds import engine_seed, minibatch_shuffle_seed, rank_seed
from search_rl.workers import distributed as D
from search_rl.workers.forward import model_token_count, response_logprobs
from search_rl.workers.micro_batches import length_order, micro_batches
from search_rl.workers.optimization import TrainableModel, epoch_order
from search_rl.workers.shared_prompts import SharedPrompts

logger = logging.getLogger(__name__)

OLD_SOURCES = ("batch", "current", "update")
"""``update_actor``'s ``old_source`` values."""


class SamplingStats:
    """Token sums of the old log-prob pass's metrics, for an update that computes the old log-probs itself:
    entropy under the sampling weights and mean |engine - trainer| log-prob, over the loss-mask tokens."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.entropy = 0.0
        self.abs_diff = 0.0

    def add(self, batch: TrainBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None, mask: torch.Tensor) -> None:
        """Add rows' (B, T) log-probs and entropies over their (B, T) ``mask``."""
        m = mask.to(logprobs.device).float()
        self.tokens += float(m.sum())
        if entropy is not None:
            self.entropy += float((entropy.detach() * m).sum())
        rollout = batch.rollout_logprobs.to(logprobs.device)
        self.abs_diff += float(((logprobs.detach() - rollout).abs() * m).sum())

    def metrics(self) -> dict[str, float]:
        """``actor/entropy_rollout`` and ``rollout/logprob_abs_diff`` (0 without tokens)."""
        n = max(self.tokens, 1.0)
        return {"actor/entropy_rollout": self.entropy / n, "rollout/logprob_abs_diff": self.abs_diff / n}


def actor_loss(
    micro: TrainBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    algo: AlgorithmConfig,
    on_policy: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The masked actor objective of one micro-batch (``compute_actor_loss`` on the batch's ``loss_mask``).

    ``on_policy``: the weights have not moved since the batch's old log-probs would have been computed (no optimizer
    step yet); the current ones, detached, serve (the PPO ratio is 1 and the gradient the same as with recomputed
    ones), and the batch's are not read.
    """
    micro.require("loss_mask", "advantages", *(() if on_policy else ("old_logprobs",)))
    assert micro.loss_mask is not None and micro.advantages is not None
    device = logprobs.device
    old = logprobs.detach() if on_policy else micro.old_logprobs
    assert old is not None
    return compute_actor_loss(
        logprobs,
        old.to(device),
        micro.advantages.to(device),
        micro.loss_mask.to(device),
        algo,
        entropy=entropy,
        ref_logprobs=micro.ref_logprobs.to(device) if micro.ref_logprobs is not None and algo.use_kl_loss else None,
        rollout_logprobs=micro.rollout_logprobs.to(device) if algo.tis_cap else None,
    )


class ActorRolloutRefWorker:
    """Policy + rollout + reference on one rank.

    Args:
        spec: rank, world size, device, threads, seed.
        model: the starting policy.
        actor: update settings.
        rollout: search loop, samples per prompt, engine.
        ref: reference settings, or None when no KL term needs it.
        algorithm: the RL objective.
        retriever: the retriever service.
    """

    def __init__(
        self,
        spec: D.WorkerSpec,
        model: ModelConfig,
        actor: ActorConfig,
        rollout: TrainRolloutConfig,
        ref: RefConfig | None,
        algorithm: AlgorithmConfig,
        retriever: RetrieverClientConfig,
    ) -> None:
        D.setup_worker_process(spec)
        self.spec, self.model_cfg, self.actor_cfg, self.rollout_cfg = spec, model, actor, rollout
        self.ref_cfg, self.algo, self.retriever_cfg = ref, algorithm, retriever
        self.tokenizer = load_tokenizer(model.path)
        self.compute_dtype = compute_dtype_on(model.dtype, spec.torch_device)  # auto: for this worker's device
        # The master copy is fp32 whatever the compute dtype: AdamW's small steps vanish in bf16 weights.
        base = load_model(model.path, dtype=torch.float32, seed=model.seed)
        self.model_config = base.config
        self.aliases: dict[str, str] = tensor_aliases(base)  # plain names (before any adapter prefixes)
        frozen = copy.deepcopy(base).requires_grad_(False)
        torch.nn.Module.to(frozen, dtype=self.compute_dtype)  # in place; transformers' typed wrapper confuses mypy
        self.lora_scaling: float | None = None
        if model.lora_rank:  # adapters on a frozen base; the base with adapters disabled is the reference
            self.policy = apply_lora(base, model.lora_rank, model.lora_alpha, model.lora_target_modules, model.seed)
            self.lora_scaling = lora_scaling(self.policy)
            self.reference = None
        else:
            self.policy = base
            self.reference = frozen if ref is not None else None
        # Checkpointed blocks re-run their forward in the backward, which would extend a shared-prompt cache twice.
        self._share_prompts = actor.share_prompts and not model.gradient_checkpointing
        if actor.share_prompts and model.gradient_checkpointing:
            logger.info("actor.share_prompts is off: it does not combine with model.gradient_checkpointing")
        if model.gradient_checkpointing:
            base.gradient_checkpointing_enable()
            if model.lora_rank:  # the frozen embeddings' output must carry grad for checkpointed blocks
                base.enable_input_require_grads()
        # The engine's own full copy (the policy's shards cannot generate alone); vLLM loads an export instead.
        hf_engine = rollout.engine in MODEL_ENGINES
        self.engine_model = (copy.deepcopy(frozen) if self.reference is not None else frozen) if hf_engine else None
        trained = [base] + ([self.reference] if self.reference is not None else [])  # not the engine's copy
        self.attn_implementation = use_trainer_attention(trained, model.attn_implementation)
        self.module: torch.nn.Module = self.policy
        self.trainable: TrainableModel | None = None
        self.engine: RolloutEngine | None = None
        self.manager: LLMGenerationManager | None = None

    # --- setup -------------------------------------------------------------------------------------------------

    def master_address(self) -> tuple[str, int]:
        return D.master_address()

    def init_distributed(self, host: str, port: int) -> None:
        """Join the process group, shard the policy (and reference), build the optimizer and the engine."""
        D.init_process_group(self.spec, host, port)
        self.module = D.shard(self.policy, self.spec, self.compute_dtype)
        if self.reference is not None:
            D.shard(self.reference, self.spec, self.compute_dtype)
        self.trainable = TrainableModel(self.module, self.actor_cfg.optim, self.actor_cfg.grad_clip, self.spec, "actor")
        rollout = build_rollout(
            self.rollout_cfg,
            self.rollout_cfg.search_loop_config(),
            self.tokenizer,
            model=self.engine_model,
            dtype=self.compute_dtype,
            device=self.spec.torch_device,
            export=self.export_for_engine,
            seed=engine_seed(self.spec.seed, self.spec.rank),
            retriever=self.retriever_cfg,
            name=f"policy-{self.spec.rank}",
        )
        self.engine, self.manager = rollout.engine, rollout.manager

    def export_for_engine(self, directory: str) -> Path:
        """Write the current policy as an HF folder in the compute dtype (for engines that load from disk, vLLM),
        from the gathered full state dict: every rank must call it; each writes its own ``directory``."""
        state = self._plain_state(D.full_state_dict(self.module))
        return save_hf_folder(
            directory,
            state,
            self.model_config,
            aliases=self.aliases,
            tokenizer=self.tokenizer,
            dtype=self.compute_dtype,
        )

    # --- rollout -----------------------------------------------------------------------------------------------

    def generate(self, prompts: PromptBatch, greedy: bool, seed: int) -> RolloutResult:
        """Roll out this worker's prompts with search; greedy for validation."""
        assert self.manager is not None, "init_distributed first"
        return self.manager.roll_out(prompts, greedy=greedy, seed=rank_seed(seed, self.spec.rank))

    def sync_weights(self, version: int, publish: bool = False) -> tuple[int, list[Any]]:
        """Load the trained weights into this worker's rollout engine and record ``version``. Every rank must call it
        (the weights are gathered from the shards).

        Args:
            version: the weight version (the step that produced the weights).
            publish: also ``ray.put`` them on rank 0 (compute dtype, CPU, tied tensors once) for the asynchronous
                modes' generators to pull (``async_rollout.weights``).

        Returns:
            the engine's version, and ``[object ref]`` on rank 0 when publishing (``[]`` otherwise): a list, so Ray
            hands the driver the reference rather than the tensors.
        """
        assert self.engine is not None
        state = without_aliases(self._plain_state(D.full_state_dict(self.module)), self.aliases)
        state = {k: v.to(self.compute_dtype) for k, v in state.items()}
        self.engine.update_weights(state.items(), version)
        refs: list[Any] = []
        if publish and self.spec.rank == 0:
            import ray

            refs = [ray.put({k: v.detach().cpu() for k, v in state.items()})]
        del state
        return self.engine.weight_version, refs

    def _plain_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base architecture's state dict: adapters merged in (``W + alpha/r * B @ A``) when training LoRA."""
        return merged_state_dict(state, self.lora_scaling) if self.lora_scaling is not None else state

    # --- log-probs ---------------------------------------------------------------------------------------------

    def compute_log_prob(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, entropies) of the responses under the current policy; (B, T) each."""
        return self._log_probs(self.module, batch, self.rollout_cfg.log_prob_micro_batch_size_per_gpu, True)

    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs of the responses under the reference policy; (B, T)."""
        if self.ref_cfg is None or (self.reference is None and self.lora_scaling is None):
            raise ValueError("compute_ref_log_prob: this worker has no reference model (no KL term is configured)")
        micro = self.ref_cfg.log_prob_micro_batch_size_per_gpu
        if self.reference is None:  # LoRA: the frozen base, adapters disabled
            with reference_forward(self.policy):
                return self._log_probs(self.module, batch, micro, False)[0]
        return self._log_probs(self.reference, batch, micro, False)[0]

    def _log_probs(
        self, model: torch.nn.Module, batch: TrainBatch, micro: int, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.actor_cfg
        model.eval()
        order = length_order(batch) if cfg.log_prob_sort_by_length else torch.arange(len(batch))
        logprobs, entropies = [], []
        with torch.no_grad():
            shared = SharedPrompts(model, batch, grad=False) if self._share_prompts and len(batch) else None
            parts = micro_batches(batch.select(order), micro, cfg.log_prob_max_token_len_per_gpu)
            for part, real in D.matched_passes(parts, self.spec):
                lp, ent = response_logprobs(
                    model,
                    part,
                    self.rollout_cfg.temperature,
                    with_entropy=with_entropy,
                    only=self._needed(part),
                    shared=shared,
                    chunk_tokens=cfg.logprob_chunk_tokens,
                )
                if real:
                    logprobs.append(lp.cpu())
                    entropies.append(ent.cpu() if ent is not None else torch.zeros_like(lp.cpu()))
        D.release_memory()
        restore = torch.argsort(order)  # back to the batch's row order
        return torch.cat(logprobs)[restore], torch.cat(entropies)[restore]

    def _needed(self, batch: TrainBatch) -> torch.Tensor:
        """(B, T) the tokens whose log-probs any loss, KL or metric reads: the batch's loss mask once the driver set
        it, else the algorithm's rule for it (model tokens, unless observations are not masked)."""
        if batch.loss_mask is not None:
            return batch.loss_mask
        return loss_mask_for(batch.response_mask, batch.response_attention_mask, self.algo)

    # --- update ------------------------------------------------------------------------------------------------

    def update_actor(self, batch: TrainBatch, step: int, old_source: str = "batch") -> dict[str, float]:
        """PPO update on this worker's shard; returns mean metrics (``actor/*``, ``perf/*``).

        ``old_source``, where the PPO ratio's old log-probs come from: ``batch`` (``batch.old_logprobs``);
        ``current`` (the update is exactly on-policy, one optimizer step over one epoch: its own log-probs,
        detached); ``update`` (one epoch, several mini-batches: the first mini-batch's rows take their own
        log-probs, detached, as no step has moved the weights yet, and only the other rows get a no-grad pass before
        the first step; the same old log-probs as a recompute pass over the whole batch, one mini-batch's pass
        fewer). With ``update`` the metrics also hold ``actor/entropy_rollout`` and ``rollout/logprob_abs_diff``,
        which the driver's recompute pass would have logged.
        """
        assert self.trainable is not None
        if old_source not in OLD_SOURCES:
            raise ValueError(f"update_actor: old_source must be one of {OLD_SOURCES}, got {old_source!r}")
        if callable(release := getattr(self.engine, "sleep", None)):
            release()  # vLLM with rollout.vllm.sleep_level frees its GPU memory; sync_weights wakes it
        cfg, n = self.actor_cfg, self.rollout_cfg.n or 1
        mini = cfg.ppo_mini_batch_size * n // self.spec.world_size
        need_entropy_grad = self.algo.entropy_coeff > 0
        if old_source == "current" and (cfg.ppo_epochs != 1 or mini < len(batch)):
            raise ValueError(
                f"update_actor(old_source='current') needs one optimizer step over one epoch; got {cfg.ppo_epochs} "
                f"epoch(s) with mini-batches of {mini} samples for a shard of {len(batch)}"
            )
        seed = minibatch_shuffle_seed(self.spec.seed, step, self.spec.rank) if cfg.shuffle else None
        stats = SamplingStats()
        if old_source == "update":
            if cfg.ppo_epochs != 1:
                raise ValueError(f"update_actor(old_source='update') needs one epoch; got {cfg.ppo_epochs}")
            # the order the update would draw, applied here so that the first mini-batch's rows are known
            batch = batch.select(epoch_order(batch.uids, seed, 0, self._share_prompts))
            seed = None
            batch = self._old_logprobs_after_first(batch, mini, stats)
        minis_started = [0]  # mini-batches whose passes have begun

        shared: list[SharedPrompts] = []  # the current mini-batch's, while its micro-batches run
        saved = [0]  # prompt tokens not encoded again, over the mini-batches

        @contextlib.contextmanager
        def mini_batch_scope(mini: TrainBatch) -> Iterator[None]:
            minis_started[0] += 1
            if not self._share_prompts:
                yield
                return
            shared.append(SharedPrompts(self.module, mini, grad=True))  # each distinct prompt encoded once
            saved[0] += shared[0].saved_tokens
            try:
                yield
                shared[0].backward()  # only after every micro-batch's backward went through
            finally:
                shared.clear()

        def loss_fn(micro: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
            logprobs, entropy = response_logprobs(
                self.module,
                micro,
                self.rollout_cfg.temperature,
                with_entropy=True,
                entropy_grad=need_entropy_grad,
                only=self._needed(micro),
                shared=shared[0] if shared else None,
                chunk_tokens=cfg.logprob_chunk_tokens,
            )
            own = old_source == "current" or (old_source == "update" and minis_started[0] == 1)
            if own and old_source == "update":
                stats.add(micro, logprobs.detach(), entropy, self._needed(micro))
            return actor_loss(micro, logprobs, entropy, self.algo, own)

        metrics = self.trainable.ppo_update(
            batch,
            loss_fn,
            mini_batch_size=mini,
            micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
            epochs=cfg.ppo_epochs,
            shuffle_seed=seed,
            loss_agg_mode=self.algo.loss_agg_mode,
            keep_groups=self._share_prompts,
            mini_batch_scope=mini_batch_scope,
            max_tokens=cfg.ppo_max_token_len_per_gpu,
        )
        metrics["perf/actor_update_tokens"] = float(model_token_count(batch) * cfg.ppo_epochs - saved[0])
        if old_source == "update":
            metrics.update(stats.metrics())
        if self.spec.device == "cuda":  # this process's peak so far: policy, reference, engine, activations
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
        D.release_memory()
        return metrics

    def _old_logprobs_after_first(self, batch: TrainBatch, mini: int, stats: SamplingStats) -> TrainBatch:
        """``batch`` (in update order) with the old log-probs of the rows after its first ``mini`` computed by a
        no-grad pass under the current weights; the first rows' stay 0 (the update takes its own for them)."""
        old = torch.zeros_like(batch.rollout_logprobs)  # (B, T)
        rest = torch.arange(min(mini, len(batch)), len(batch))
        if len(rest):
            later = batch.select(rest)
            logprobs, entropies = self._log_probs(
                self.module, later, self.rollout_cfg.log_prob_micro_batch_size_per_gpu, True
            )
            old[rest] = logprobs
            stats.add(later, logprobs, entropies, self._needed(later))
        return batch.replace(old_logprobs=old)

    def update_sft(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step of supervised fine-tuning on this worker's shard: the mean negative log-likelihood of
        the ``loss_mask`` tokens (model turns; retrieved tokens never carry loss), token-mean over all ranks."""
        assert self.trainable is not None
        batch.require("loss_mask")

        def loss_fn(micro: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
            assert micro.loss_mask is not None
            chunk = self.actor_cfg.logprob_chunk_tokens
            logprobs, _ = response_logprobs(self.module, micro, 1.0, only=micro.loss_mask, chunk_tokens=chunk)
            mask = micro.loss_mask.to(logprobs.device).float()
            nll = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
            return nll, {"sft/nll": nll.item()}

        metrics = self.trainable.ppo_update(
            batch,
            loss_fn,
            mini_batch_size=len(batch),
            micro_batch_size=self.actor_cfg.ppo_micro_batch_size_per_gpu,
            epochs=1,
            shuffle_seed=None,
            loss_agg_mode="token-mean",
            max_tokens=self.actor_cfg.ppo_max_token_len_per_gpu,
        )
        assert batch.loss_mask is not None
        metrics["perf/actor_update_tokens"] = float(model_token_count(batch))
        metrics["perf/sft_loss_tokens"] = float(batch.loss_mask.sum())
        D.release_memory()
        return metrics

    # --- checkpoints -------------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> None:
        """Rank 0 writes ``actor/`` (an HF model folder, fp32, with the tokenizer) and ``actor_optim.pt``, both
        unsharded: any number of ranks can resume from them. Every rank must call it."""
        assert self.trainable is not None
        path = Path(directory)
        state = D.full_state_dict(self.module, rank0_only=True)
        self.trainable.save_optimizer(path / "actor_optim.pt")
        if self.spec.rank == 0:
            plain = self._plain_state(state)
            save_hf_folder(path / "actor", plain, self.model_config, aliases=self.aliases, tokenizer=self.tokenizer)
            if self.lora_scaling is not None:
                save_adapters(self.policy, path / ADAPTER_DIR, adapter_state_dict(state))

    def load_checkpoint(self, directory: str) -> None:
        """Load weights and optimizer state written by ``save_checkpoint`` (then the driver syncs the engine): the
        adapters on top of ``model.path`` when training LoRA, else the whole ``actor/`` model."""
        assert self.trainable is not None
        path = Path(directory)
        if self.lora_scaling is not None:
            state = D.full_state_dict(self.module)  # the frozen base as it is, adapters replaced below
            state.update(load_adapters(path / ADAPTER_DIR, state))
            D.load_full_state_dict(self.module, state)
        else:
            saved = AutoModelForCausalLM.from_pretrained(path / "actor", dtype=torch.float32, local_files_only=True)
            D.load_full_state_dict(self.module, saved.state_dict())
            del saved
        self.trainable.load_optimizer(path / "actor_optim.pt")

    def peak_memory_mb(self) -> float:
        """Peak resident memory of this worker process (Linux ``ru_maxrss``), in MiB."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
