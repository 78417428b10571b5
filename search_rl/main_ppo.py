"""Train with PPO or GRPO: ``python -m search_rl.main_ppo [group=option] [key=value ...]`` (Hydra).

    python -m search_rl.main_ppo do_search=true max_turns=4                   # PPO on SmolLM2-135M, the defaults
    python -m search_rl.main_ppo algorithm=grpo                               # GRPO (4 samples per prompt)
    python -m search_rl.main_ppo model=tiny trainer.total_training_steps=1    # one-minute smoke run
    python -m search_rl.main_ppo --cfg job                                    # print the composed config

The only module that knows every concrete class. Order of work: compose and type-check the config (Hydra), then
``prepare``: everything that can fail without Ray (cross-field checks against the model's context length, the
retriever's ``/health`` and one real search, the data files and prompt lengths, metric sinks) — a failure there
exits with code 2 and one clear message. Only then ``train`` starts Ray (``ray_session``), the worker groups and the
``PPOTrainer``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from search_rl.agent.retriever_client import RetrieverClient
from search_rl.async_rollout import AsyncRolloutSource, SourceSettings, WeightStore
from search_rl.checkpoint import CheckpointManager
from search_rl.config import CONFIG_DIR, ConfigError, PPOConfig, StepSettings, register_configs
from search_rl.data import PromptDataset, PromptLoader, read_rows
from search_rl.launch import History, build_run_tracker, fit_with_workers, make_group, run_main, worker_specs
from search_rl.models import load_tokenizer, model_context_length
from search_rl.protocol import PromptBatch
from search_rl.tracking import RolloutDumper, Tracker
from search_rl.trainer import PPOTrainer, RolloutSource, Workers, _step_seed
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
from search_rl.workers.critic import CriticWorker
from search_rl.workers.generator import GeneratorWorker

logger = logging.getLogger("search_rl.main_ppo")


@dataclass
class Prepared:
    """What ``prepare`` checked and built before Ray starts."""

    tokenizer: PreTrainedTokenizerBase
    train_loader: PromptLoader
    val_batch: PromptBatch | None
    tracker: Tracker


def prepare(cfg: PPOConfig, config_dict: dict[str, Any] | None = None) -> Prepared:
    """Check everything that can be checked without Ray, and load the data.

    Raises:
        ConfigError: impossible budgets or batch sizes. RetrieverError: the retriever is not reachable.
        FileNotFoundError / ValueError: missing or malformed data files, a model that cannot be found.
        ImportError: a requested metric sink is not installed.
    """
    rollout = cfg.actor_rollout_ref.rollout
    tokenizer = load_tokenizer(cfg.model.path)
    cfg.validate(rollout.hf.max_model_len or model_context_length(cfg.model.path, tokenizer))
    check_mode(cfg)
    if rollout.do_search and rollout.max_turns > 0:
        RetrieverClient(cfg.retriever).check_reachable()
    train = PromptDataset(
        read_rows(cfg.data.train_files), tokenizer, rollout.max_prompt_tokens, cfg.data.filter_overlong_prompts
    )
    loader = PromptLoader(train, cfg.data.train_batch_size, cfg.n_samples, cfg.data.shuffle, cfg.trainer.seed)
    val_batch = None
    if cfg.data.val_files and cfg.trainer.test_freq > 0:
        val = PromptDataset(
            read_rows(cfg.data.val_files), tokenizer, rollout.max_prompt_tokens, cfg.data.filter_overlong_prompts
        )
        val_batch = val.batch(val.subset_indices(cfg.data.val_max_samples, cfg.data.val_seed))
    return Prepared(tokenizer, loader, val_batch, build_run_tracker(cfg.trainer, config_dict))


def build_workers(cfg: PPOConfig, device: str, local: bool = False) -> tuple[Workers, Workers | None]:
    """The actor (+ rollout + reference) group and, when the estimator needs one, the critic group.

    ``local=True`` builds one in-process worker each (no Ray; ``trainer.n_workers`` must be 1).
    """
    t = cfg.trainer
    generators = t.n_generators if t.mode != "sync" else 0  # they share the cores too
    specs = worker_specs(t, device, n_groups=(2 if cfg.use_critic else 1) + generators)
    arr = cfg.actor_rollout_ref
    actor_kwargs = dict(
        model=cfg.model,
        actor=arr.actor,
        rollout=arr.rollout,
        ref=arr.ref if cfg.use_reference else None,
        algorithm=cfg.algorithm,
        retriever=cfg.retriever,
    )
    critic_kwargs = dict(model=cfg.model, critic=cfg.critic, algorithm=cfg.algorithm, n_samples=cfg.n_samples)
    groups = [make_group(ActorRolloutRefWorker, "actor", specs, t, local, **actor_kwargs)]
    if cfg.use_critic:
        groups.append(make_group(CriticWorker, "critic", specs, t, local, **critic_kwargs))
    for group in groups:  # constructors of both groups have been running concurrently; now rendezvous
        group.start()
    return groups[0], (groups[1] if cfg.use_critic else None)


def check_mode(cfg: PPOConfig) -> None:
    """What ``trainer.mode`` one_step_off / async cannot be combined with.

    Raises:
        ConfigError: dynamic sampling (it re-rolls inside the lock-step ``collect``).
    """
    filter_groups = getattr(cfg.algorithm, "filter_groups", None)
    if cfg.trainer.mode != "sync" and filter_groups is not None and filter_groups.enable:
        raise ConfigError(
            "algorithm.filter_groups.enable=true rolls out more prompts inside the lock-step step; it does not "
            f"combine with trainer.mode={cfg.trainer.mode} (use trainer.mode=sync)"
        )
    if cfg.trainer.samples_may_be_stale and not cfg.algorithm.tis_cap:
        logger.warning(
            "trainer.mode=%s trains on samples of older weights with algorithm.tis_cap=0: the PPO ratio starts "
            "from recomputed log-probs and nothing corrects for the older policy that sampled (null picks 2.0)",
            cfg.trainer.mode,
        )


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


def build_rollout_source(cfg: PPOConfig, loader: PromptLoader, actor: Workers, device: str) -> AsyncRolloutSource:
    """The generators (Ray actors, each its own engine), the weight store and the coordinator of the asynchronous
    modes. Generators get ``trainer.cpus_per_worker`` CPUs and, on GPU, a GPU each (the actor workers keep theirs).

    Raises:
        ConfigError: on GPU, fewer GPUs than actor workers + generators.
    """
    import ray

    t = cfg.trainer
    if device == "cuda" and ray.cluster_resources().get("GPU", 0) < t.n_workers + t.n_generators:
        raise ConfigError(
            f"trainer.mode={t.mode} on GPU gives each of trainer.n_workers={t.n_workers} actor workers and "
            f"trainer.n_generators={t.n_generators} generators a GPU; Ray sees "
            f"{ray.cluster_resources().get('GPU', 0):g}"
        )
    spec = worker_specs(t, device, n_groups=(2 if cfg.use_critic else 1) + t.n_generators)[0]
    store = ray.remote(WeightStore).options(num_cpus=0).remote()
    remote_cls: Any = ray.remote(GeneratorWorker)

    def make_generator(i: int) -> Any:
        return remote_cls.options(num_cpus=t.cpus_per_worker, num_gpus=1.0 if device == "cuda" else 0.0).remote(
            spec, cfg.model, cfg.actor_rollout_ref.rollout, cfg.retriever, store
        )

    return AsyncRolloutSource(
        source_settings(cfg),
        loader=loader,
        actor=actor,
        store=store,
        make_generator=make_generator,
        n_generators=t.n_generators,
        seed_for=lambda k: _step_seed(t.seed, k),
    )


def build_trainer(
    cfg: PPOConfig, prepared: Prepared, actor: Workers, critic: Workers | None, source: RolloutSource | None = None
) -> PPOTrainer:
    """The loop with its collaborators."""
    run_dir = Path(cfg.trainer.default_local_dir)
    tokenizer = prepared.tokenizer
    settings = StepSettings(
        pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id),
        response_width=cfg.actor_rollout_ref.rollout.max_response_tokens,
        use_reference=cfg.use_reference,
        greedy_baseline=cfg.needs_greedy_baseline,
        reward=cfg.reward,
        max_retriever_error_rate=cfg.actor_rollout_ref.rollout.max_retriever_error_rate,
        train_on_retriever_errors=cfg.actor_rollout_ref.rollout.train_on_retriever_errors,
        old_logprobs=cfg.actor_rollout_ref.actor.old_logprobs,
        on_policy_update=cfg.on_policy_update,
        engine_matches_trainer=cfg.engine_matches_trainer,
    )
    return PPOTrainer(
        cfg.trainer,
        cfg.algorithm,
        settings,
        actor=actor,
        critic=critic,
        train_data=prepared.train_loader,
        val_data=prepared.val_batch,
        tracker=prepared.tracker,
        checkpoints=CheckpointManager(run_dir, cfg.trainer.max_ckpt_to_keep),
        dumper=RolloutDumper(run_dir / "rollouts", tokenizer) if cfg.trainer.dump_rollouts else None,
        source=source,
    )


def train(cfg: PPOConfig, prepared: Prepared) -> History:
    """Start Ray (unless already running, or ``trainer.use_ray=false``), the workers and the loop; return the metric
    history (``launch.fit_with_workers``)."""

    def build(device: str, local: bool, groups: list[Any]) -> PPOTrainer:
        actor, critic = build_workers(cfg, device, local=local)
        groups += [actor, critic]
        source = None
        if cfg.trainer.mode != "sync":
            source = build_rollout_source(cfg, prepared.train_loader, actor, device)
            groups.append(source)
        return build_trainer(cfg, prepared, actor, critic, source)

    return fit_with_workers(cfg.trainer, prepared.tracker, build)


def run(cfg: PPOConfig, config_dict: dict[str, Any] | None = None) -> History:
    """``prepare`` then ``train`` (the programmatic entry: tests, benchmarks, demos)."""
    return train(cfg, prepare(cfg, config_dict))


@hydra.main(config_path=str(CONFIG_DIR), config_name="ppo_trainer", version_base=None)
def main(composed: DictConfig) -> None:
    run_main(composed, prepare, train, "training", logger)


register_configs()

if __name__ == "__main__":
    main()
