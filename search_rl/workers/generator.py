"""``GeneratorWorker``: a rollout-only Ray actor for ``trainer.mode=one_step_off`` / ``async`` (no optimizer, no
reference, no process group): its own engine (HF on CPU, vLLM on GPU), the search loop, and a handle on the run's
``WeightStore``.

``generate(prompts, seed, n_shards)`` is one unit of work. Before it starts, the worker *pulls*: if the store holds
a newer version than its engine serves, it fetches and loads it. Weights never change during a unit, so every
episode finishes on the version it started with and every trajectory is tagged with exactly that version (cutting
episodes at a weight change and resuming them on new weights would mix two policies in one trajectory, whose rollout
log-probs then match neither; ``max_staleness`` already bounds how old a finished episode can be).

The prompts are rolled out shard by shard exactly as ``ActorRolloutRefWorker.generate`` on ``n_shards`` data-parallel
ranks would (same shard split, same per-rank seed offsets), so one generator with ``max_staleness=0`` samples the
very tokens the synchronous trainer samples.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import torch
from transformers import PreTrainedModel

from search_rl.agent.generation_manager import LLMGenerationManager
from search_rl.agent.retriever_client import RetrieverClient
from search_rl.config import ModelConfig, RetrieverClientConfig, TrainRolloutConfig
from search_rl.datatypes import RolloutResult
from search_rl.models import dtype_of, load_model, load_tokenizer
from search_rl.models.weights import save_hf_folder, tensor_aliases
from search_rl.protocol import PromptBatch
from search_rl.rollout.base import RolloutEngine
from search_rl.rollout.hf import HFEngine
from search_rl.workers import distributed as D
from search_rl.workers.actor_rollout_ref import SEED_STRIDE_PER_RANK

logger = logging.getLogger(__name__)


def rollout_shard(manager: LLMGenerationManager, prompts: PromptBatch, seed: int) -> RolloutResult:
    """Sampled search rollouts of ``prompts`` with ``seed`` (no gradients), with the retriever's retries counted."""
    client = manager.retriever
    retries_before = client.retries if isinstance(client, RetrieverClient) else 0
    with torch.no_grad():
        result = manager.generate([list(p) for p in prompts.prompt_ids], greedy=False, seed=seed)
    if isinstance(client, RetrieverClient):
        result.metrics["rollout/retriever_retries"] = float(client.retries - retries_before)
    return result


class GeneratorWorker:
    """One generator: engine + search loop, pulling weights by version from ``store``.

    Args:
        spec: device, threads, seed (rank and world size are unused: generators share no process group).
        model: the starting policy (the same weights as the actor's, version 0).
        rollout: search loop and engine settings.
        retriever: the retriever service.
        store: the run's ``WeightStore`` actor handle.
    """

    def __init__(
        self,
        spec: D.WorkerSpec,
        model: ModelConfig,
        rollout: TrainRolloutConfig,
        retriever: RetrieverClientConfig,
        store: Any,
    ) -> None:
        D.setup_worker_process(spec)
        self.spec, self.store = spec, store
        self.tokenizer = load_tokenizer(model.path)
        engine_model = load_model(model.path, dtype=torch.float32, seed=model.seed)
        engine_model.requires_grad_(False)
        torch.nn.Module.to(engine_model, dtype=dtype_of(model.dtype))  # in place, like the actor's engine copy
        self.engine = self._build_engine(engine_model, rollout)
        client = RetrieverClient(retriever)
        self.manager = LLMGenerationManager(self.engine, self.tokenizer, client, rollout.search_loop_config())
        self.pulls = 0

    def _build_engine(self, model: PreTrainedModel, cfg: TrainRolloutConfig) -> RolloutEngine:
        if cfg.engine == "vllm":
            from search_rl.rollout.vllm import VLLMEngine

            directory = tempfile.mkdtemp(prefix="search-rl-generator-")
            save_hf_folder(
                directory, model.state_dict(), model.config, aliases=tensor_aliases(model), tokenizer=self.tokenizer
            )
            return VLLMEngine(
                directory,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                max_model_len=cfg.hf.max_model_len,
                seed=self.spec.seed,
            )
        torch.nn.Module.to(model, self.spec.torch_device)  # in place
        return HFEngine(model, self.tokenizer, cfg.hf)

    def weight_version(self) -> int:
        """The version the engine serves (also a readiness probe: the constructor has finished)."""
        return self.engine.weight_version

    def pull(self) -> int:
        """Load the store's newest weights if they are newer than the engine's; returns the engine's version."""
        import ray

        version, refs = ray.get(self.store.latest.remote())
        if refs and version != self.engine.weight_version:
            state: dict[str, torch.Tensor] = ray.get(refs[0])
            self.engine.update_weights(state.items(), version)
            self.pulls += 1
            del state
        return self.engine.weight_version

    def generate(self, prompts: PromptBatch, seed: int, n_shards: int) -> tuple[int, list[RolloutResult]]:
        """One unit of work: pull, then roll out ``prompts`` as ``n_shards`` data-parallel ranks would.

        Returns:
            the weight version every trajectory was sampled with, and one ``RolloutResult`` per shard.
        """
        version = self.pull()
        results = [
            rollout_shard(self.manager, shard, seed + SEED_STRIDE_PER_RANK * rank)
            for rank, shard in enumerate(prompts.split(n_shards))
        ]
        if self.engine.weight_version != version:
            raise RuntimeError(f"generator: weights changed during a unit ({version} -> {self.engine.weight_version})")
        return version, results
