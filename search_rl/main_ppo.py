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
from search_rl.checkpoint import CheckpointManager
from search_rl.config import CONFIG_DIR, PPOConfig, StepSettings, register_configs
from search_rl.data import PromptDataset, PromptLoader, read_rows
from search_rl.launch import History, build_run_tracker, fit_with_workers, make_group, run_main, worker_specs
from search_rl.models import load_tokenizer, model_context_length
from search_rl.protocol import PromptBatch
from search_rl.tracking import RolloutDumper, Tracker
from search_rl.trainer import PPOTrainer, Workers
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
        val_batch = val.batch(val.subset_indices(cfg.data.val_max_samples, cfg.trainer.seed))
    return Prepared(tokenizer, loader, val_batch, build_run_tracker(cfg.trainer, config_dict))


def build_workers(cfg: PPOConfig, device: str, local: bool = False) -> tuple[Workers, Workers | None]:
    """The actor (+ rollout + reference) group and, when the estimator needs one, the critic group.

    ``local=True`` builds one in-process worker each (no Ray; ``trainer.n_workers`` must be 1).
    """
    t = cfg.trainer
    specs = worker_specs(t, device, n_groups=2 if cfg.use_critic else 1)
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


def build_trainer(cfg: PPOConfig, prepared: Prepared, actor: Workers, critic: Workers | None) -> PPOTrainer:
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
    )


def train(cfg: PPOConfig, prepared: Prepared) -> History:
    """Start Ray (unless already running, or ``trainer.use_ray=false``), the workers and the loop; return the metric
    history (``launch.fit_with_workers``)."""

    def build(device: str, local: bool, groups: list[Any]) -> PPOTrainer:
        actor, critic = build_workers(cfg, device, local=local)
        groups += [actor, critic]
        return build_trainer(cfg, prepared, actor, critic)

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
