"""Supervised warm start: ``python -m search_rl.main_sft [group=option] [key=value ...]`` (Hydra).

    python -m search_rl.main_sft                                         # SmolLM2-135M on the shipped trajectories
    python -m search_rl.main_sft trainer.total_training_steps=20         # shorter
    python -m search_rl.main_sft model=tiny trainer.total_training_steps=2 trainer.test_freq=0   # smoke run
    python -m search_rl.main_ppo algorithm=grpo model.path=runs/sft/global_step_100   # then RL from the result

Teaches the policy the search protocol from synthesised trajectories (``python -m data_prep.synth_sft``): masked
next-token log-likelihood on the model turns, the retrieved ``<information>`` tokens never carry loss (the RL mask).
Same structure as ``main_ppo``: compose and type-check the config, ``prepare`` everything that can fail without Ray
(budgets against the model's context, the data, the retriever when validation searches) — a failure there exits
with code 2 and one message — then Ray, the actor workers and ``SFTTrainer``. Checkpoints are ``main_ppo``'s.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from search_rl.agent.retriever_client import RetrieverClient
from search_rl.checkpoint import CheckpointManager
from search_rl.config import (
    CONFIG_DIR,
    AlgorithmConfig,
    SFTConfig,
    StepSettings,
    exit_on_renamed,
    load_config,
    register_configs,
)
from search_rl.data import PromptDataset, PromptLoader, read_rows
from search_rl.launch import History, build_run_tracker, fit_with_workers, make_group, run_main, worker_specs
from search_rl.models import load_tokenizer, model_context_length
from search_rl.protocol import PromptBatch
from search_rl.sft.data import SFTDataset
from search_rl.sft.trainer import SFTTrainer
from search_rl.tracking import RolloutDumper, Tracker
from search_rl.trainer import Workers
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker

logger = logging.getLogger("search_rl.main_sft")


def load_sft_config(overrides: Sequence[str] = ()) -> SFTConfig:
    """Compose ``configs/sft_trainer.yaml`` with command-line style overrides (tests and scripts)."""
    cfg = load_config(list(overrides), config_name="sft_trainer")
    assert isinstance(cfg, SFTConfig)
    return cfg


@dataclass
class PreparedSFT:
    """What ``prepare`` checked and built before Ray starts."""

    tokenizer: PreTrainedTokenizerBase
    dataset: SFTDataset
    train_loader: PromptLoader
    val_batch: PromptBatch | None
    tracker: Tracker


def prepare(cfg: SFTConfig, config_dict: dict[str, Any] | None = None) -> PreparedSFT:
    """Check what can be checked without Ray and load the examples (counts of examples left out are logged).

    Raises:
        ConfigError, ValueError, FileNotFoundError, RetrieverError, ImportError: see ``main_ppo.prepare``.
    """
    rollout = cfg.rollout
    tokenizer = load_tokenizer(cfg.model.path)
    cfg.validate(rollout.hf.max_model_len or model_context_length(cfg.model.path, tokenizer))
    validating = bool(cfg.data.val_files) and cfg.trainer.test_freq > 0
    if validating and rollout.do_search and rollout.max_turns > 0:
        RetrieverClient(cfg.retriever).check_reachable()
    dataset = SFTDataset(
        cfg.data.train_files,
        tokenizer,
        rollout.search_loop_config(),
        cfg.mask_observations,
        cfg.data.filter_overlong_prompts,
    )
    loader = PromptLoader(dataset, cfg.data.train_batch_size, 1, cfg.data.shuffle, cfg.trainer.seed)
    logger.info("warm start: %s", {k: round(v, 1) for k, v in dataset.stats().items()})
    val_batch = None
    if validating:
        val = PromptDataset(read_rows(cfg.data.val_files), tokenizer, rollout.max_prompt_tokens, True)
        val_batch = val.batch(val.subset_indices(cfg.data.val_max_samples, cfg.data.val_seed))
    return PreparedSFT(tokenizer, dataset, loader, val_batch, build_run_tracker(cfg.trainer, config_dict))


def build_actor(cfg: SFTConfig, device: str, local: bool = False) -> Workers:
    """The actor group (``trainer.n_workers`` data-parallel workers; ``local=True``: one, in this process)."""
    kwargs = dict(
        model=cfg.model,
        actor=cfg.actor_config(),
        rollout=cfg.rollout,
        ref=None,
        algorithm=AlgorithmConfig(use_kl_loss=False, mask_observations=cfg.mask_observations),
        retriever=cfg.retriever,
    )
    group = make_group(ActorRolloutRefWorker, "actor", worker_specs(cfg.trainer, device), cfg.trainer, local, **kwargs)
    group.start()
    return group


def build_trainer(cfg: SFTConfig, prepared: PreparedSFT, actor: Workers) -> SFTTrainer:
    """The loop with its collaborators."""
    run_dir = Path(cfg.trainer.default_local_dir)
    settings = StepSettings(
        pad_token_id=prepared.dataset.pad_token_id,
        response_width=cfg.rollout.max_response_tokens,
        use_reference=False,
        greedy_baseline=False,
        reward=cfg.reward,
    )
    return SFTTrainer(
        cfg.trainer,
        AlgorithmConfig(use_kl_loss=False, mask_observations=cfg.mask_observations),
        settings,
        actor=actor,
        critic=None,
        train_data=prepared.train_loader,
        val_data=prepared.val_batch,
        tracker=prepared.tracker,
        checkpoints=CheckpointManager(run_dir, cfg.trainer.max_ckpt_to_keep),
        dumper=RolloutDumper(run_dir / "rollouts", prepared.tokenizer) if cfg.trainer.dump_rollouts else None,
    )


def train(cfg: SFTConfig, prepared: PreparedSFT) -> History:
    """Start Ray (unless already running, or ``trainer.use_ray=false``), the actor workers and the loop; return the
    metric history (``launch.fit_with_workers``)."""

    def build(device: str, local: bool, groups: list[Any]) -> SFTTrainer:
        actor = build_actor(cfg, device, local=local)
        groups.append(actor)
        return build_trainer(cfg, prepared, actor)

    return fit_with_workers(cfg.trainer, prepared.tracker, build)


@hydra.main(config_path=str(CONFIG_DIR), config_name="sft_trainer", version_base=None)
def main(composed: DictConfig) -> None:
    run_main(composed, prepare, train, "the warm start", logger)


register_configs()

if __name__ == "__main__":
    exit_on_renamed("sft_trainer", sys.argv[1:])
    main()
