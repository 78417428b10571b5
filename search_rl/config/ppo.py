"""``PPOConfig``, the root of ``configs/ppo_trainer.yaml``, and ``PPOConfig.validate``: the cross-field checks that
run before Ray starts. Key names follow Search-R1/verl where they exist (``do_search``, ``max_turns``,
``actor_rollout_ref.rollout.n``, ``trainer.total_training_steps``, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field

from search_rl.config.algorithm import AlgorithmConfig
from search_rl.config.loading import ConfigError
from search_rl.config.model import ModelConfig, check_trainable_dtype
from search_rl.config.roles import ActorRolloutRefConfig, CriticConfig
from search_rl.config.rollout import DEFAULT_MAX_TURNS, derive_search_turns
from search_rl.config.run import DataConfig, RewardConfig, TrainerConfig
from search_rl.config.search_backends import RetrieverClientConfig

DEFAULT_GROUP_SIZE = 4
"""``rollout.n`` when it is left ``null`` and the estimator compares samples of a prompt."""


DEFAULT_TIS_CAP = 2.0
"""``algorithm.tis_cap`` of the asynchronous modes when left ``null``."""


@dataclass
class PPOConfig:
    """The root of ``configs/ppo_trainer.yaml``."""

    do_search: bool = True
    """Execute ``<search>`` actions against the retriever (Search-R1's key; false: every episode is a single answer
    turn)."""
    max_turns: int = DEFAULT_MAX_TURNS
    """Search turns per episode, then one final answer turn (Search-R1's key). With ``do_search`` it sets the
    rollout's ``search_turns``, the one value the rollout reads."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The starting policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy update, rollout and reference."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator, losses, KL (``docs/algorithms.md``)."""
    retriever: RetrieverClientConfig = field(default_factory=RetrieverClientConfig)
    """The retriever service the rollout queries."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring functions per data source."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop, checkpoints, workers and logging."""

    def __post_init__(self) -> None:
        check_trainable_dtype(self.model)
        self.actor_rollout_ref.rollout.search_turns = derive_search_turns(self.do_search, self.max_turns)

    @property
    def n_samples(self) -> int:
        """Samples per prompt (``rollout.n`` once resolved)."""
        return int(self.actor_rollout_ref.rollout.n or 1)

    @property
    def use_critic(self) -> bool:
        return bool(self.critic.enable)

    @property
    def use_reference(self) -> bool:
        """A reference policy is needed for the KL loss or the KL-in-reward penalty."""
        return self.algorithm.use_kl_loss or self.algorithm.use_kl_in_reward

    @property
    def engine_matches_trainer(self) -> bool:
        """The engine's sampling log-probs are the trainer's up to float noise: the HF or static engine in float32
        (bf16 rounds them apart, ``tests/search_rl/workers/test_bf16_compute.py``; ``auto`` still unresolved, left to
        the workers of a cluster, may be bf16)."""
        return self.actor_rollout_ref.rollout.engine in ("hf", "static") and self.model.dtype == "float32"

    @property
    def on_policy_update(self) -> bool:
        """One optimizer step per batch over one epoch: the update starts and ends its only step on the weights
        that generated the batch, so the PPO ratio is 1 throughout."""
        actor = self.actor_rollout_ref.actor
        return actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= self.data.train_batch_size

    def validate(self, max_model_len: int) -> None:
        """Cross-field checks that need no Ray and no model weights (only the model's context length).

        Raises:
            ConfigError: with the keys involved and how to fix them.
        """
        try:
            self.actor_rollout_ref.rollout.validate(max_model_len)
        except ValueError as e:
            raise ConfigError(f"impossible length budget: {e}") from e
        self._validate_batches()
        if self.trainer.test_freq > 0 and not self.data.val_files:
            raise ConfigError("trainer.test_freq > 0 but data.val_files is empty; add files or set test_freq=0")
        self._validate_dapo_and_warmup()

    def _validate_dapo_and_warmup(self) -> None:
        """Dynamic sampling needs groups, the overlong buffer must fit the budget, critic warm-up needs a critic."""
        if self.algorithm.filter_groups.enable and self.n_samples < 2:
            raise ConfigError(
                f"algorithm.filter_groups.enable keeps groups whose rewards differ, but actor_rollout_ref.rollout.n="
                f"{self.n_samples} gives groups of one sample; set it to 2 or more"
            )
        budget, buffer = self.actor_rollout_ref.rollout.max_response_tokens, self.reward.overlong_buffer_tokens
        if buffer >= budget:
            raise ConfigError(
                f"reward.overlong_buffer_tokens={buffer} must be below actor_rollout_ref.rollout.max_response_tokens="
                f"{budget}: the overlong penalty starts that many tokens before the budget"
            )
        if self.actor_rollout_ref.actor.old_logprobs == "update" and self.algorithm.use_kl_in_reward:
            raise ConfigError(
                "actor_rollout_ref.actor.old_logprobs=update computes the old log-probs inside the update, but "
                "algorithm.use_kl_in_reward needs them before it (for the rewards); use recompute or auto"
            )
        if self.trainer.critic_warmup > 0 and not self.use_critic:
            raise ConfigError(
                f"trainer.critic_warmup={self.trainer.critic_warmup} warms up a critic, but the run has none "
                f"(algorithm.adv_estimator={self.algorithm.adv_estimator}, critic.enable={self.critic.enable}); "
                "set trainer.critic_warmup=0"
            )

    def _validate_batches(self) -> None:
        n, workers = self.n_samples, self.trainer.n_workers
        batch = self.data.train_batch_size
        for role, mini in (
            ("actor_rollout_ref.actor", self.actor_rollout_ref.actor.ppo_mini_batch_size),
            ("critic", self.critic.ppo_mini_batch_size),
        ):
            if role == "critic" and not self.use_critic:
                continue
            if batch % mini:
                raise ConfigError(
                    f"data.train_batch_size={batch} is not a multiple of {role}.ppo_mini_batch_size={mini}; "
                    "every optimizer step must see a full mini-batch"
                )
            if (mini * n) % workers:
                raise ConfigError(
                    f"{role}.ppo_mini_batch_size={mini} x rollout.n={n} = {mini * n} samples cannot be split evenly "
                    f"over trainer.n_workers={workers}; change one of them"
                )
