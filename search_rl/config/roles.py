"""How each model of the run is updated: the actor (policy), the reference, the critic."""

from __future__ import annotations

from dataclasses import dataclass, field

from search_rl.config.loading import ConfigError
from search_rl.config.model import OptimConfig
from search_rl.config.rollout import TrainRolloutConfig

OLD_LOGPROB_SOURCES = ("auto", "recompute", "rollout", "update")
"""Valid ``actor_rollout_ref.actor.old_logprobs`` values."""


@dataclass
class ActorConfig:
    """How the policy is updated on a batch (verl's ``actor_rollout_ref.actor``)."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer of the policy."""
    ppo_mini_batch_size: int = 2
    """Prompts per optimizer step (each with its ``rollout.n`` samples), summed over all workers."""
    ppo_micro_batch_size_per_gpu: int = 1
    """Samples per forward/backward pass on one worker; gradients accumulate over a mini-batch."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""
    shuffle: bool = True
    """Shuffle samples before splitting into mini-batches (seeded by step and epoch, so resumes reproduce it)."""
    share_prompts: bool = True
    """Encode each distinct prompt of a mini-batch once (a group's ``rollout.n`` samples share it) and shuffle whole
    groups, so mini-batches hold complete groups; also in the old and reference log-prob passes. Off (or with
    gradient checkpointing) every sample's pass encodes its own prompt and samples are shuffled one by one."""
    old_logprobs: str = "auto"
    """Where the PPO ratio's old log-probs come from: ``recompute`` (a forward pass before the update),
    ``rollout`` (the engine's sampling log-probs), ``update`` (``ppo_epochs=1`` only: the update's first mini-batch
    takes its own log-probs, detached, and a pass before the first optimizer step covers only the other mini-batches:
    the values of ``recompute``, one mini-batch's pass fewer) or ``auto``: no pass when the update is exactly
    on-policy (one mini-batch, one epoch, fresh weights: the ratio is 1, so the current log-probs, detached, serve),
    the engine's when it computes as the trainer does (HF engine, float32), else ``update`` with one epoch, else
    ``recompute``."""
    logprob_chunk_tokens: int = 0
    """Compute log-probs and entropies from the hidden states this many tokens at a time (the update and the old and
    reference passes), never holding every token's full-vocabulary float32 logits; the backward recomputes each
    chunk's logits (one more output-head matmul). The same values and gradients; 0 = all tokens at once."""
    ppo_max_token_len_per_gpu: int = 0
    """Size the update's micro-batches by padded tokens (rows x longest prompt + longest response) instead of
    ``ppo_micro_batch_size_per_gpu`` samples: rows sorted by length are packed up to this budget (a longer row goes
    alone). The loss is the same however a mini-batch is split; 0 = by samples."""
    log_prob_max_token_len_per_gpu: int = 0
    """The same token budget for the old and reference log-prob passes (forward only: can be about twice
    ``ppo_max_token_len_per_gpu``); 0 = by the passes' ``log_prob_micro_batch_size_per_gpu`` samples."""
    log_prob_sort_by_length: bool = True
    """Run the old and reference log-prob passes over rows sorted by length, so each micro-batch is cut to rows of
    similar length (results are returned in the batch's order)."""

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"actor_rollout_ref.actor.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("logprob_chunk_tokens", "ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
            if getattr(self, name) < 0:
                raise ConfigError(f"actor_rollout_ref.actor.{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.old_logprobs not in OLD_LOGPROB_SOURCES:
            raise ConfigError(
                f"actor_rollout_ref.actor.old_logprobs must be one of {OLD_LOGPROB_SOURCES}, got {self.old_logprobs!r}"
            )
        if self.old_logprobs == "update" and self.ppo_epochs != 1:
            raise ConfigError(
                "actor_rollout_ref.actor.old_logprobs=update needs ppo_epochs=1 (a later epoch's first mini-batch "
                f"runs on moved weights), got ppo_epochs={self.ppo_epochs}; use recompute or auto"
            )
        if self.grad_clip < 0:
            raise ConfigError(f"actor_rollout_ref.actor.grad_clip must be >= 0, got {self.grad_clip}")


@dataclass
class RefConfig:
    """The frozen reference policy (the starting weights), used for the KL terms."""

    log_prob_micro_batch_size_per_gpu: int = 2
    """Samples per forward pass of the reference model."""

    def __post_init__(self) -> None:
        if self.log_prob_micro_batch_size_per_gpu < 1:
            raise ConfigError("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu must be >= 1")


@dataclass
class ActorRolloutRefConfig:
    """The worker that holds the policy, its generation engine and the reference policy."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy updates."""
    rollout: TrainRolloutConfig = field(default_factory=TrainRolloutConfig)
    """Generation with search."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference log-probs."""


@dataclass
class CriticConfig:
    """The value model: the policy's backbone with a scalar head (used by ``gae``)."""

    enable: bool | None = None
    """Train a critic; ``null`` = exactly when the advantage estimator reads values (``gae``)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Optimizer of the critic."""
    ppo_mini_batch_size: int = 2
    """Prompts per critic optimizer step (each with its ``rollout.n`` samples), summed over all workers."""
    ppo_micro_batch_size_per_gpu: int = 1
    """Samples per forward/backward pass on one worker."""
    forward_micro_batch_size_per_gpu: int = 2
    """Samples per forward pass when computing values."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "forward_micro_batch_size_per_gpu"):
            if getattr(self, name) < 1:
                raise ConfigError(f"critic.{name} must be >= 1, got {getattr(self, name)}")
        if self.ppo_epochs < 1 or self.grad_clip < 0:
            raise ConfigError("critic.ppo_epochs must be >= 1 and critic.grad_clip >= 0")
