"""Train with PPO or GRPO: ``python -m search_rl.main_ppo [group=option] [key=value ...]`` (Hydra).

    python -m search_rl.main_ppo do_search=true max_turns=4                   # PPO on SmolLM2-135M, the defaults
    python -m search_rl.main_ppo algorithm=grpo                               # GRPO (4 samples per prompt)
    python -m search_rl.main_ppo model=tiny trainer.total_training_steps=1    # one-minute smoke run
    python -m search_rl.main_ppo --cfg job                                    # print the composed config

The only module that knows every concrete class. Order of work: compose and type-check the config (Hydra), then
``prepare``: everything that can fail without Ray (cross-field checks against the model's context length, the
retriever's ``/health`` and one real search, the data files and prompt lengths, metric sinks) — a failure there
exits with code 2 and one clear message. Only then ``train`` starts Ray (``ray_session``), the worker groups and the
``TrainingLoop`` with a ``PPOStep``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from search_rl.algorithms import estimator_needs
from search_rl.async_rollout.build import build_rollout_source
from search_rl.batches import PromptBatch
from search_rl.config import CONFIG_DIR, ConfigError, PPOConfig, StepSettings, exit_on_renamed, register_configs
from search_rl.launch import build_run_tracker, make_group, run_main, worker_session, worker_specs
from search_rl.models import load_tokenizer, model_context_length
from search_rl.prompt_data import PromptDataset, PromptLoader, read_rows
from search_rl.rollout.backends import build_retriever, write_backend_manifest
from search_rl.rollout.tools import prompt_tools
from search_rl.tracking import RolloutDumper, Tracker
from search_rl.trainer.checkpoint import CheckpointManager
from search_rl.trainer.collect import AsyncCollector, Collector, RolloutSource, SyncCollector
from search_rl.trainer.dump import RunDumper
from search_rl.trainer.loop import History, TrainingLoop, Validation
from search_rl.trainer.ppo import PPOStep
from search_rl.workers import Workers, WorkerSpec
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
from search_rl.workers.critic import CriticWorker

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
    if rollout.search_turns > 0:
        retriever = build_retriever(cfg.retriever)
        retriever.check_reachable()
        write_backend_manifest(Path(cfg.trainer.default_local_dir) / "retrieval.json", cfg.retriever, retriever)
    tools = prompt_tools(rollout.search_loop_config(), tokenizer)
    train = PromptDataset(
        read_rows(cfg.data.train_files), tokenizer, rollout.max_prompt_tokens, cfg.data.filter_overlong_prompts, tools
    )
    loader = PromptLoader(train, cfg.data.train_batch_size, cfg.n_samples, cfg.data.shuffle, cfg.trainer.seed)
    val_batch = None
    if cfg.data.val_files and cfg.trainer.test_freq > 0:
        val = PromptDataset(
            read_rows(cfg.data.val_files), tokenizer, rollout.max_prompt_tokens, cfg.data.filter_overlong_prompts, tools
        )
        val_batch = val.batch(val.subset_indices(cfg.data.val_max_samples, cfg.data.val_seed))
    return Prepared(tokenizer, loader, val_batch, build_run_tracker(cfg.trainer, config_dict))


def build_workers(
    cfg: PPOConfig, device: str, local: bool = False
) -> tuple[Workers[ActorRolloutRefWorker], Workers[CriticWorker] | None]:
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
    actor = make_group(ActorRolloutRefWorker, "actor", specs, t, local, **actor_kwargs)
    critic = make_group(CriticWorker, "critic", specs, t, local, **critic_kwargs) if cfg.use_critic else None
    actor.start()  # constructors of both groups have been running concurrently; now rendezvous
    if critic is not None:
        critic.start()
    return actor, critic


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


def step_settings(cfg: PPOConfig, tokenizer: PreTrainedTokenizerBase) -> StepSettings:
    """The facts about the run that a step needs besides the trainer and algorithm settings."""
    rollout = cfg.actor_rollout_ref.rollout
    return StepSettings(
        pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id),
        response_width=rollout.max_response_tokens,
        use_reference=cfg.use_reference,
        greedy_baseline=estimator_needs(cfg.algorithm.adv_estimator).greedy_baseline,
        reward=cfg.reward,
        max_retriever_error_rate=rollout.max_retriever_error_rate,
        train_on_retriever_errors=rollout.train_on_retriever_errors,
        old_logprobs=cfg.actor_rollout_ref.actor.old_logprobs,
        on_policy_update=cfg.on_policy_update,
        engine_matches_trainer=cfg.engine_matches_trainer,
        one_epoch_update=cfg.actor_rollout_ref.actor.ppo_epochs == 1,
    )


def build_collector(
    cfg: PPOConfig, prepared: Prepared, actor: Workers[ActorRolloutRefWorker], source: RolloutSource | None = None
) -> Collector:
    """Lock-step rollouts on the actor workers (``trainer.mode=sync``) or the asynchronous generators' ``source``."""
    settings = step_settings(cfg, prepared.tokenizer)
    if source is not None:
        return AsyncCollector(source, prepared.train_loader, settings)
    t = cfg.trainer
    return SyncCollector(actor, prepared.train_loader, cfg.algorithm, settings, t.seed, t.n_workers)


def build_trainer(
    cfg: PPOConfig,
    prepared: Prepared,
    actor: Workers[ActorRolloutRefWorker],
    critic: Workers[CriticWorker] | None,
    source: RolloutSource | None = None,
) -> TrainingLoop:
    """The loop with its collaborators: a ``PPOStep`` over the collector, validation, checkpoints, dumps."""
    t, run_dir, settings = cfg.trainer, Path(cfg.trainer.default_local_dir), step_settings(cfg, prepared.tokenizer)
    dumper = RunDumper(RolloutDumper(run_dir / "rollouts", prepared.tokenizer) if t.dump_rollouts else None)
    step = PPOStep(
        cfg.algorithm,
        settings,
        actor=actor,
        critic=critic,
        collector=build_collector(cfg, prepared, actor, source),
        dumper=dumper,
        critic_warmup=t.critic_warmup,
    )
    validation = None
    if prepared.val_batch is not None:
        validation = Validation(prepared.val_batch, cfg.reward, settings.response_width)
    return TrainingLoop(
        t,
        step,
        actor=actor,
        critic=critic,
        validation=validation,
        tracker=prepared.tracker,
        checkpoints=CheckpointManager(run_dir, t.max_ckpt_to_keep),
        dumper=dumper,
    )


def generator_spec(cfg: PPOConfig, device: str) -> WorkerSpec:
    """A generator's share of the machine: the actor, critic and generators split the cores."""
    t = cfg.trainer
    return worker_specs(t, device, n_groups=(2 if cfg.use_critic else 1) + t.n_generators)[0]


def train(cfg: PPOConfig, prepared: Prepared) -> History:
    """Start the workers (in Ray unless ``trainer.use_ray=false``), the rollout source of the asynchronous modes and
    the loop; return the metric history."""
    with worker_session(cfg.trainer, prepared.tracker) as session:
        actor, critic = build_workers(cfg, session.device, local=session.local)
        session.started(actor)
        if critic is not None:
            session.started(critic)
        source = None
        if cfg.trainer.mode != "sync":
            spec = generator_spec(cfg, session.device)
            source = session.started(build_rollout_source(cfg, prepared.train_loader, actor, spec))
        return build_trainer(cfg, prepared, actor, critic, source).fit()


def run(cfg: PPOConfig, config_dict: dict[str, Any] | None = None) -> History:
    """``prepare`` then ``train`` (the programmatic entry: tests, benchmarks, demos)."""
    return train(cfg, prepare(cfg, config_dict))


@hydra.main(config_path=str(CONFIG_DIR), config_name="ppo_trainer", version_base=None)
def main(composed: DictConfig) -> None:
    run_main(composed, prepare, train, "training", logger)


register_configs()

if __name__ == "__main__":
    exit_on_renamed("ppo_trainer", sys.argv[1:])
    main()
