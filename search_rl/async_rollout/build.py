"""Building the asynchronous modes' parts from the config: the coordinator's schedule, the weight store and the
generator actors (``trainer.mode`` one_step_off / async)."""

from __future__ import annotations

from typing import Any

from search_rl.async_rollout.coordinator import AsyncRolloutSource, SourceSettings
from search_rl.async_rollout.generator import GeneratorWorker
from search_rl.async_rollout.weights import WeightStore
from search_rl.config import ConfigError, PPOConfig
from search_rl.prompt_data import PromptLoader
from search_rl.seeds import step_seed
from search_rl.workers import Workers, WorkerSpec
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker


def source_settings(cfg: PPOConfig) -> SourceSettings:
    """The coordinator's schedule: ``one_step_off`` is one batch in flight, one version stale; ``async`` takes
    ``trainer.max_staleness`` and ``trainer.max_queue_batches``."""
    t, per_step = cfg.trainer, cfg.data.train_batch_size
    one_off = t.mode == "one_step_off"
    return SourceSettings(
        max_staleness=1 if one_off else t.max_staleness,
        capacity_groups=per_step * (1 if one_off else t.max_queue_batches),
        groups_per_step=per_step,
        n_shards=t.n_workers,
        max_restarts=t.max_generator_restarts,
        timeout_s=t.worker_timeout_s,
    )


def build_rollout_source(
    cfg: PPOConfig, loader: PromptLoader, actor: Workers[ActorRolloutRefWorker], spec: WorkerSpec
) -> AsyncRolloutSource:
    """The generators (Ray actors, each its own engine), the weight store and the coordinator. Generators get
    ``trainer.cpus_per_worker`` CPUs and, on GPU, a GPU each (the actor workers keep theirs).

    Args:
        spec: a generator's device, threads and seed.

    Raises:
        ConfigError: on GPU, fewer GPUs than actor workers + generators.
    """
    import ray

    t, on_gpu = cfg.trainer, spec.device == "cuda"
    if on_gpu and ray.cluster_resources().get("GPU", 0) < t.n_workers + t.n_generators:
        raise ConfigError(
            f"trainer.mode={t.mode} on GPU gives each of trainer.n_workers={t.n_workers} actor workers and "
            f"trainer.n_generators={t.n_generators} generators a GPU; Ray sees "
            f"{ray.cluster_resources().get('GPU', 0):g}"
        )
    store = ray.remote(WeightStore).options(num_cpus=0).remote()
    remote_cls: Any = ray.remote(GeneratorWorker)

    def make_generator(i: int) -> Any:
        return remote_cls.options(num_cpus=t.cpus_per_worker, num_gpus=1.0 if on_gpu else 0.0).remote(
            spec, cfg.model, cfg.actor_rollout_ref.rollout, cfg.retriever, store
        )

    return AsyncRolloutSource(
        source_settings(cfg),
        loader=loader,
        actor=actor,
        store=store,
        make_generator=make_generator,
        n_generators=t.n_generators,
        seed_for=lambda k: step_seed(t.seed, k),
    )
