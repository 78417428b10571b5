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
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from search_rl.agent.retriever_client import RetrieverClient
from search_rl.algorithms import AlgorithmConfig
from search_rl.checkpoint import CheckpointManager
from search_rl.data import PromptDataset, PromptLoader, read_rows
from search_rl.main_ppo import PREPARE_ERRORS, model_context_length, ray_session, resolve_device
from search_rl.models import load_tokenizer
from search_rl.protocol import PromptBatch
from search_rl.sft.config import SFTConfig, register_sft_config
from search_rl.sft.data import SFTDataset
from search_rl.sft.trainer import SFTTrainer
from search_rl.tracking import RolloutDumper, Tracker, build_tracker
from search_rl.train_config import CONFIG_DIR, to_config
from search_rl.trainer import StepSettings, Workers
from search_rl.workers import LocalWorkerGroup, WorkerGroup, WorkerSpec
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker

logger = logging.getLogger("search_rl.main_sft")


def load_sft_config(overrides: Sequence[str] = ()) -> SFTConfig:
    """Compose ``configs/sft_trainer.yaml`` with command-line style overrides (tests and scripts)."""
    from hydra import compose, initialize_config_dir

    register_sft_config()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = to_config(compose(config_name="sft_trainer", overrides=list(overrides)))
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
        val_batch = val.batch(val.subset_indices(cfg.data.val_max_samples, cfg.trainer.seed))
    t = cfg.trainer
    tracker = build_tracker(
        t.logger,
        Path(t.default_local_dir),
        t.total_training_steps,
        t.project_name,
        t.experiment_name,
        config_dict or {},
    )
    return PreparedSFT(tokenizer, dataset, loader, val_batch, tracker)


def build_actor(cfg: SFTConfig, device: str, local: bool = False) -> Workers:
    """The actor group (``trainer.n_workers`` data-parallel workers; ``local=True``: one, in this process)."""
    t = cfg.trainer
    threads = t.torch_threads_per_worker or max(1, (os.cpu_count() or 1) // t.n_workers)
    specs = [
        WorkerSpec(rank=r, world_size=t.n_workers, device=device, torch_threads=threads, seed=t.seed)
        for r in range(t.n_workers)
    ]
    kwargs = dict(
        model=cfg.model,
        actor=cfg.actor_config(),
        rollout=cfg.rollout,
        ref=None,
        algorithm=AlgorithmConfig(use_kl_loss=False, mask_observations=cfg.mask_observations),
        retriever=cfg.retriever,
    )
    group: Any
    if local:
        group = LocalWorkerGroup(ActorRolloutRefWorker, specs[0], **kwargs)
    else:
        gpus = 1.0 if device == "cuda" else 0.0
        group = WorkerGroup(
            ActorRolloutRefWorker,
            specs,
            name="actor",
            num_cpus=t.cpus_per_worker,
            num_gpus=gpus,
            timeout_s=t.worker_timeout_s,
            **kwargs,
        )
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


def train(cfg: SFTConfig, prepared: PreparedSFT) -> list[tuple[int, dict[str, float]]]:
    """Start Ray (unless already running), the actor workers and the loop; return the metric history."""
    try:
        with ray_session(cfg.trainer.ray_address) as groups:
            actor = build_actor(cfg, resolve_device(cfg.trainer.device))
            groups.append(actor)
            return build_trainer(cfg, prepared, actor).fit()
    finally:
        prepared.tracker.close()


@hydra.main(config_path=str(CONFIG_DIR), config_name="sft_trainer", version_base=None)
def main(composed: DictConfig) -> None:
    try:
        cfg = to_config(composed)
        prepared = prepare(cfg, OmegaConf.to_container(composed, resolve=True))  # type: ignore[arg-type]
    except PREPARE_ERRORS as e:
        logger.error("cannot start the warm start: %s", e)
        sys.exit(2)
    history = train(cfg, prepared)
    logger.info("done: %d steps logged; checkpoints and metrics in %s", len(history), cfg.trainer.default_local_dir)


register_sft_config()

if __name__ == "__main__":
    main()
