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
from pathlib import Path
from typing import Any

import torch

from search_rl.batches import PromptBatch
from search_rl.config import ModelConfig, RetrieverClientConfig, TrainRolloutConfig
from search_rl.datatypes import RolloutResult
from search_rl.models import load_model, load_tokenizer
from search_rl.models.compute_dtype import compute_dtype_on
from search_rl.models.weights import save_hf_folder, tensor_aliases
from search_rl.rollout.assembly import build_rollout
from search_rl.seeds import rank_seed
from search_rl.workers import distributed as D

logger = logging.getLogger(__name__)


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

        def export(directory: str) -> Path:
            state, aliases = engine_model.state_dict(), tensor_aliases(engine_model)
            return save_hf_folder(directory, state, engine_model.config, aliases=aliases, tokenizer=self.tokenizer)

        built = build_rollout(
            rollout,
            rollout.search_loop_config(),
            self.tokenizer,
            model=engine_model,
            dtype=compute_dtype_on(model.dtype, spec.torch_device),  # auto: for this generator's device
            device=spec.torch_device,
            export=export,
            seed=spec.seed,
            retriever=retriever,
            name="generator",
        )
        self.engine, self.manager = built.engine, built.manager
        self.pulls = 0

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
            self.manager.roll_out(shard, greedy=False, seed=rank_seed(seed, rank))
            for rank, shard in enumerate(prompts.split(n_shards))
        ]
        if self.engine.weight_version != version:
            raise RuntimeError(f"generator: weights changed during a unit ({version} -> {self.engine.weight_version})")
        return version, results
