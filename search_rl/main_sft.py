"""Supervised warm start: ``python -m search_rl.main_sft [group=option] [key=value ...]`` (Hydra).

    python -m search_rl.main_sft                                         # SmolLM2-135M on the shipped trajectories
    python -m search_rl.main_sft trainer.total_training_steps=20         # shorter
    python -m search_rl.main_sft model=tiny trainer.total_training_steps=2 trainer.test_freq=0   # smoke run
    python -m search_rl.main_ppo algorithm=grpo model.path=runs/sft/global_step_100   # then RL from the result

Teaches the policy the search protocol from synthesised trajectories (``python -m data_prep.synth_sft``): masked
next-token log-likelihood on the model turns, the retrieved ``<information>`` tokens never carry loss (the RL mask).
Same structure as ``main_ppo``: compose and type-check the config, ``prepare`` everything that can fail without Ray
(budgets against the model's context, the data, the retriever when validation searches) — a failure there exits
with code 2 and one message — then Ray, the actor workers and the ``TrainingLoop`` with an ``SFTStep``.
Checkpoints are ``main_ppo``'s.
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

from search_rl.batches import PromptBatch
from search_rl.config import CONFIG_DIR, AlgorithmConfig, SFTConfig, exit_on_renamed, register_configs
from search_rl.configure import load_config
from search_rl.launch import build_run_tracker, make_group, run_main, worker_session, worker_specs
from search_rl.models import load_tokenizer, model_context_length
from search_rl.prompt_data import PromptDataset, PromptLoader, read_rows
from search_rl.rollout.backends import build_retriever
from search_rl.sft.dataset import SFTDataset
from search_rl.tracking import RolloutDumper, Tracker
from search_rl.trainer.checkpoint import CheckpointManager
from search_rl.trainer.dump import RunDumper
from search_rl.trainer.loop import History, TrainingLoop, Validation
from search_rl.trainer.sft import SFTStep
from search_rl.workers import Workers
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
    if validating and rollout.search_turns > 0:
        build_retriever(cfg.retriever).check_reachable()
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


def build_actor(cfg: SFTConfig, device: str, local: bool = False) -> Workers[ActorRolloutRefWorker]:
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


def build_trainer(cfg: SFTConfig, prepared: PreparedSFT, actor: Workers[ActorRolloutRefWorker]) -> TrainingLoop:
    """The loop with its collaborators: an ``SFTStep``, validation, checkpoints, dumps."""
    t, run_dir = cfg.trainer, Path(cfg.trainer.default_local_dir)
    dumper = RunDumper(RolloutDumper(run_dir / "rollouts", prepared.tokenizer) if t.dump_rollouts else None)
    validation = None
    if prepared.val_batch is not None:
        validation = Validation(prepared.val_batch, cfg.reward, cfg.rollout.max_response_tokens)
    return TrainingLoop(
        t,
        SFTStep(actor, prepared.train_loader),
        actor=actor,
        critic=None,
        validation=validation,
        tracker=prepared.tracker,
        checkpoints=CheckpointManager(run_dir, t.max_ckpt_to_keep),
        dumper=dumper,
    )


def train(cfg: SFTConfig, prepared: PreparedSFT) -> History:
    """Start the actor workers (in Ray unless ``trainer.use_ray=false``) and the loop; return the metric history."""
    with worker_session(cfg.trainer, prepared.tracker) as session:
        actor = session.started(build_actor(cfg, session.device, local=session.local))
        return build_trainer(cfg, prepared, actor).fit()


@hydra.main(config_path=str(CONFIG_DIR), config_name="sft_trainer", version_base=None)
def main(composed: DictConfig) -> None:
    run_main(composed, prepare, train, "the warm start", logger)


register_configs()

if __name__ == "__main__":
    exit_on_renamed("sft_trainer", sys.argv[1:])
    main()
