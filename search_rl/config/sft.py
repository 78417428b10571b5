"""``SFTConfig``, the root of ``configs/sft_trainer.yaml`` (the warm start).

It shares the groups of ``configs/ppo_trainer.yaml`` where they mean the same thing, under the same key paths:
``model``, ``actor_rollout_ref.actor`` (optimizer, micro-batch, clipping), ``actor_rollout_ref.rollout`` (its budgets
decide how examples are tokenized, and validation rolls out with it), ``retriever`` (validation searches),
``trainer`` (loop length, checkpoints, workers, logging) — so an SFT run and the RL run that starts from it agree on
budgets and layout by construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from search_rl.config.loading import ConfigError
from search_rl.config.model import ModelConfig, OptimConfig, check_trainable_dtype
from search_rl.config.roles import ActorConfig
from search_rl.config.rollout import (
    DEFAULT_MAX_TURNS,
    TrainRolloutConfig,
    derive_search_turns,
)
from search_rl.config.run import DataConfig, RewardConfig, TrainerConfig
from search_rl.config.search_backends import RetrieverClientConfig

SFT_TRAIN_FILE = "data/datasets/nq_hotpotqa_mini/sft_train.parquet"
"""The shipped warm-start trajectories (``python -m data_prep.synth_sft``)."""


@dataclass
class SFTActorConfig:
    """How the policy is updated by the warm start: the keys it shares with ``actor_rollout_ref.actor`` of RL. One
    optimizer step per batch of ``data.train_batch_size`` examples."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5, weight_decay=0.0, lr_warmup_steps=5))
    """AdamW of the policy."""
    ppo_micro_batch_size_per_gpu: int = 4
    """Examples per forward/backward pass on one worker (gradients accumulate over the step's batch)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""

    def __post_init__(self) -> None:
        if self.ppo_micro_batch_size_per_gpu < 1:
            micro = self.ppo_micro_batch_size_per_gpu
            raise ConfigError(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must be >= 1, got {micro}")
        if self.grad_clip < 0:
            raise ConfigError(f"actor_rollout_ref.actor.grad_clip must be >= 0, got {self.grad_clip}")


@dataclass
class SFTRolloutConfig:
    """``actor_rollout_ref`` of the warm start: the update (``actor``) and the rollout it shares with RL
    (``configs/rollout/*.yaml`` fill it)."""

    actor: SFTActorConfig = field(default_factory=SFTActorConfig)
    """Optimizer, micro-batches, clipping (same key paths as RL's ``actor_rollout_ref.actor``)."""
    rollout: TrainRolloutConfig = field(default_factory=lambda: TrainRolloutConfig(engine="hf"))
    """Budgets the examples must fit, and the search loop of validation (the ``hf`` engine: ``rollout=hf``)."""


@dataclass
class SFTConfig:
    """The root of ``configs/sft_trainer.yaml``."""

    do_search: bool = True
    """Validation rollouts execute ``<search>`` actions (Search-R1's key; false: a single answer turn, and examples
    with a search are left out)."""
    max_turns: int = DEFAULT_MAX_TURNS
    """Search turns per episode (validation; examples with more searches are left out and counted). With
    ``do_search`` it sets the rollout's ``search_turns``, the one value the rollout reads."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The starting policy."""
    data: DataConfig = field(default_factory=lambda: DataConfig(train_files=[SFT_TRAIN_FILE], train_batch_size=16))
    """Warm-start files (``train_files``), validation prompts (``val_files``), examples per step."""
    mask_observations: bool = True
    """Keep retrieved ``<information>`` tokens out of the loss, as the RL losses do (false = ablation)."""
    actor_rollout_ref: SFTRolloutConfig = field(default_factory=SFTRolloutConfig)
    """The rollout budgets and validation search loop (same keys as in ``ppo_trainer.yaml``)."""
    retriever: RetrieverClientConfig = field(default_factory=RetrieverClientConfig)
    """The retriever service validation queries."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring of validation rollouts."""
    trainer: TrainerConfig = field(
        default_factory=lambda: TrainerConfig(
            experiment_name="sft", default_local_dir="runs/sft", total_training_steps=100, save_freq=50, test_freq=50
        )
    )
    """Loop length, validation and checkpoint schedule, workers, logging (100 steps of 16 examples: about one epoch
    of the shipped trajectories)."""

    def __post_init__(self) -> None:
        check_trainable_dtype(self.model)
        self.actor_rollout_ref.rollout.search_turns = derive_search_turns(self.do_search, self.max_turns)
        if self.actor_rollout_ref.rollout.action_format != "tags":
            raise ConfigError(
                "actor_rollout_ref.rollout.action_format=chat_template: the warm start builds its examples from the "
                "rows' turns in Search-R1's tags, and its validation must roll out the same way; keep "
                "action_format=tags here (chat-template tool calls are for main_ppo and main_eval)"
            )
        if self.actor_rollout_ref.rollout.n is None:
            self.actor_rollout_ref.rollout.n = 1

    @property
    def rollout(self) -> TrainRolloutConfig:
        return self.actor_rollout_ref.rollout

    def validate(self, max_model_len: int) -> None:
        """Cross-field checks before Ray starts.

        Raises:
            ConfigError: an impossible length budget, or a batch that does not split over the workers.
        """
        try:
            self.rollout.validate(max_model_len)
        except ValueError as e:
            raise ConfigError(f"impossible length budget: {e}") from e
        if self.data.train_batch_size % self.trainer.n_workers:
            raise ConfigError(
                f"data.train_batch_size={self.data.train_batch_size} cannot be split evenly over "
                f"trainer.n_workers={self.trainer.n_workers}"
            )
        if self.trainer.test_freq > 0 and not self.data.val_files:
            raise ConfigError("trainer.test_freq > 0 but data.val_files is empty; add files or set test_freq=0")

    def actor_config(self) -> ActorConfig:
        """The worker's update settings: one optimizer step per batch, split into micro-batches."""
        actor = self.actor_rollout_ref.actor
        return ActorConfig(
            optim=actor.optim,
            ppo_mini_batch_size=self.data.train_batch_size,
            ppo_micro_batch_size_per_gpu=actor.ppo_micro_batch_size_per_gpu,
            ppo_epochs=1,
            grad_clip=actor.grad_clip,
            shuffle=False,
        )
