"""The run around the models: data, reward, the loop (checkpoints, workers, logging)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from search_rl.config.health import HealthConfig, check_stop_on
from search_rl.config.loading import ConfigError

DEVICES = ("auto", "cpu", "cuda")

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")

TRAINER_MODES = ("sync", "one_step_off", "async")
"""``trainer.mode`` values (docs/training.md#training-modes)."""

PARTIAL_CREDITS = ("f1", "subem")
"""Components that ``reward.partial_credit`` may name."""
MAX_FORMAT_SCORE = 0.5
"""``reward.format_score`` stays below this, so that ``1 - fs`` (right, malformed) beats ``fs`` (wrong, well-formed)."""


def shaping_enabled(format_score: float, partial_credit: str | None) -> bool:
    """Whether reward shaping changes anything (with both off the reward is exactly the base score)."""
    return format_score > 0 or partial_credit is not None


@dataclass
class DataConfig:
    """Parquet files of Search-R1 rows (``docs/data.md``)."""

    train_files: list[str] = field(default_factory=lambda: ["data/datasets/nq_hotpotqa_mini/train.parquet"])
    """Training parquet files (relative paths are taken from the working directory, then from the repository)."""
    val_files: list[str] = field(default_factory=lambda: ["data/datasets/nq_hotpotqa_mini/val.parquet"])
    """Validation parquet files (a slice of train: choose settings and steps on it, report on test); metrics are
    reported per ``data_source``."""
    train_batch_size: int = 4
    """Prompts per training step (each rolled out ``rollout.n`` times)."""
    val_max_samples: int | None = 32
    """Validate on a fixed, seeded subset of this many rows (``null`` = every row)."""
    val_seed: int = 0
    """Seed of that subset: kept apart from ``trainer.seed`` so that runs of different seeds validate on the same
    questions."""
    shuffle: bool = True
    """Shuffle the training rows each epoch (seeded by ``trainer.seed`` and the epoch)."""
    filter_overlong_prompts: bool = True
    """Drop rows whose prompt exceeds ``rollout.max_prompt_tokens`` (counted and logged) instead of failing."""

    def __post_init__(self) -> None:
        if not self.train_files:
            raise ConfigError("data.train_files is empty; give at least one parquet file")
        if self.train_batch_size < 1:
            raise ConfigError(f"data.train_batch_size must be >= 1, got {self.train_batch_size}")
        if self.val_max_samples is not None and self.val_max_samples < 1:
            raise ConfigError("data.val_max_samples must be >= 1 or null (every row)")


@dataclass
class RewardConfig:
    """Which ``REWARDS`` entry scores each data source (``search_rl/reward/scorers.py``), and the shaping applied on
    top of it (``search_rl/reward/shaping.py``; off by default, so the reward is exactly the chosen score)."""

    default: str = "qa_em"
    """Reward of a data source with no entry below and no built-in choice (exact match)."""
    by_data_source: dict[str, str] = field(default_factory=dict)
    """Overrides per data source; values are registry names or ``pkg.module:function``. Set one from the command
    line with ``+reward.by_data_source.nq=qa_f1`` (new dict keys need Hydra's ``+``)."""
    format_score: float = 0.0
    """Shaping: reward of a well-formed episode with a wrong answer, and what a right answer in a malformed episode
    loses (Search-R1's ``format_score``; 0 = off). In ``[0, 0.5)`` so a right answer always scores more."""
    partial_credit: str | None = None
    """Shaping: ``null`` (off), ``f1`` or ``subem``: a wrong answer also earns ``partial_credit_weight`` times this
    measure of its extracted answer (the larger of that and ``format_score`` counts)."""
    partial_credit_weight: float = 0.0
    """Shaping: weight of ``partial_credit``; > 0 exactly when it is set, and below ``1 - format_score``."""
    overlong_buffer_tokens: int = 0
    """DAPO's overlong penalty (0 = off): a response longer than ``rollout.max_response_tokens`` minus this many
    tokens loses up to ``overlong_penalty_factor``, linearly, reaching it at the budget. The length is the whole
    response, model tokens and observations, as the budget counts it. Below ``rollout.max_response_tokens``."""
    overlong_penalty_factor: float = 1.0
    """The overlong penalty at the budget (DAPO: 1.0); >= 0."""
    search_penalty: float = 0.0
    """Shaping: subtracted from the score per search the episode sent (0 = off), a price on retrieval such as a paid
    web search; reported as the component ``search_penalty``. In ``[0, 1)``."""

    def __post_init__(self) -> None:
        if not 0 <= self.search_penalty < 1:
            raise ConfigError(f"reward.search_penalty must be in [0, 1), got {self.search_penalty}")
        if self.overlong_buffer_tokens < 0 or self.overlong_penalty_factor < 0:
            raise ConfigError(
                f"reward.overlong_buffer_tokens ({self.overlong_buffer_tokens}) and reward.overlong_penalty_factor "
                f"({self.overlong_penalty_factor}) must be >= 0 (a buffer of 0 turns the overlong penalty off)"
            )
        fs, credit, weight = self.format_score, self.partial_credit, self.partial_credit_weight
        if not 0 <= fs < MAX_FORMAT_SCORE:
            raise ConfigError(
                f"reward.format_score must be in [0, {MAX_FORMAT_SCORE}), got {fs}: a right answer in a malformed "
                "episode scores 1 - format_score, which must beat format_score (a wrong, well-formed one)"
            )
        if credit is not None and credit not in PARTIAL_CREDITS:
            raise ConfigError(f"reward.partial_credit must be null or one of {PARTIAL_CREDITS}, got {credit!r}")
        if not 0 <= weight < 1 - fs:
            raise ConfigError(
                f"reward.partial_credit_weight must be in [0, 1 - reward.format_score) = [0, {1 - fs:g}), got "
                f"{weight}: a wrong answer can have full partial credit and must still score below a right one"
            )
        if (credit is None) != (weight == 0):
            raise ConfigError(
                f"reward.partial_credit={credit or 'null'} and reward.partial_credit_weight={weight} do not go "
                "together: set both (e.g. partial_credit=f1 partial_credit_weight=0.3) or neither"
            )
        names = {
            "reward.default": self.default,
            **{f"reward.by_data_source.{k}": v for k, v in self.by_data_source.items()},
        }
        presets = [key for key, name in names.items() if name == "qa_em_format"]
        if presets and shaping_enabled(fs, credit):
            raise ConfigError(
                f"{presets[0]}=qa_em_format is already shaped (format_score 0.2) and would be shaped twice by "
                "reward.format_score / reward.partial_credit; use qa_em with the shaping keys instead"
            )


@dataclass
class TrainerConfig:
    """The training loop: length, schedule of validation and checkpoints, workers, logging."""

    project_name: str = "search-rl"
    """Project name (TensorBoard/wandb)."""
    experiment_name: str = "default"
    """Run name; the default output folder is ``runs/<experiment_name>``."""
    default_local_dir: str = "runs/default"
    """Where checkpoints, metrics, rollout dumps and the Hydra config of the run go."""
    total_training_steps: int = 6
    """Training steps to run (a resumed run continues up to this number)."""
    critic_warmup: int = 0
    """Steps 1..N update only the critic (verl's key): the actor is not updated and the engines keep the initial
    weights, so the values fit the starting policy before it moves. Needs a critic; 0 = off."""
    save_freq: int = 3
    """Save a checkpoint every this many steps, and after the last step (0 = never)."""
    test_freq: int = 3
    """Validate every this many steps, and after the last step (0 = never)."""
    val_before_train: bool = False
    """Validate once before the first step."""
    resume: str = "auto"
    """``auto`` (continue from the latest checkpoint in ``default_local_dir`` if any), ``disable``, or the path of
    a ``global_step_N`` folder."""
    max_ckpt_to_keep: int = 2
    """Keep this many most recent checkpoints (0 = keep all)."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """Metric sinks: ``console``, ``jsonl`` (``metrics.jsonl``), ``tensorboard`` (skipped with a warning when not
    installed), ``wandb`` (must be installed)."""
    dump_rollouts: bool = True
    """Write every training and validation trajectory to ``rollouts/*.jsonl`` (see docs/training.md)."""
    n_workers: int = 1
    """Data-parallel workers of the actor (and of the critic); they share gradients through torch.distributed."""
    device: str = "auto"
    """``cpu``, ``cuda`` (NCCL + FSDP), or ``auto`` (cuda when Ray sees GPUs)."""
    cpus_per_worker: float = 0.5
    """CPUs Ray reserves per worker (fractions are fine on small machines)."""
    torch_threads_per_worker: int = 0
    """torch intra-op threads per worker; 0 = the machine's cores divided by the number of worker processes
    (``n_workers``, twice that with a critic)."""
    ray_address: str | None = None
    """``null`` starts a local Ray; ``auto`` joins the cluster of ``ray start``; or ``ray://host:port``."""
    use_ray: bool = True
    """``false`` runs the actor (and critic) as one worker each inside the driver process, without Ray (needs
    ``n_workers=1``): a single-GPU box without Ray, a debugger. Same workers, same FSDP2 path."""
    seed: int = 0
    """Seed of data order, sampling and initialisation (resumed runs reproduce the same steps)."""
    worker_timeout_s: float = 3600.0
    """Longest wait for one call on the workers before the run fails (a stuck collective never hangs forever)."""
    mode: str = "sync"
    """``sync`` (roll out, then learn: lock-step), ``one_step_off`` (a generator rolls out step k+1 while the actor
    learns from step k: every batch is one weight version old) or ``async`` (generators roll out continuously into a
    bounded queue, at most ``max_staleness`` versions old). See docs/training.md#training-modes."""
    n_generators: int = 1
    """Rollout-only generator actors in ``one_step_off`` (exactly 1) and ``async`` (any); none in ``sync``."""
    max_staleness: int = 1
    """``async``: a group is trained on only if its weights are at most this many versions older than the trainer's
    (older ones are dropped and counted in ``async/dropped_stale``); 0 = on-policy, the ``sync`` schedule."""
    max_queue_batches: int = 2
    """``async``: bound of the trainer's queue, in training batches, counting finished groups and those being
    generated (back-pressure stops the generators at the bound)."""
    max_generator_restarts: int = 3
    """Generator actors that die are replaced (their unit generated again) this many times per run; then the run
    stops with an error."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Early warnings of a collapsing run: thresholds (docs/evaluation.md#early-warnings-during-training)."""
    stop_on: list[str] = field(default_factory=list)
    """Warnings that stop the run after saving a checkpoint, e.g. ``[entropy_collapse,length_blowup]`` (empty = warn
    only; names in ``trainer.health``'s docs)."""

    @property
    def samples_may_be_stale(self) -> bool:
        """Whether the loop may train on samples of older weights: ``one_step_off``, or ``async`` with
        ``max_staleness > 0``."""
        return self.mode == "one_step_off" or (self.mode == "async" and self.max_staleness > 0)

    def __post_init__(self) -> None:
        if self.total_training_steps < 1:
            raise ConfigError(f"trainer.total_training_steps must be >= 1, got {self.total_training_steps}")
        if self.critic_warmup < 0:
            raise ConfigError(f"trainer.critic_warmup must be >= 0 steps, got {self.critic_warmup}")
        if self.n_workers < 1:
            raise ConfigError(f"trainer.n_workers must be >= 1, got {self.n_workers}")
        if self.device not in DEVICES:
            raise ConfigError(f"trainer.device must be one of {DEVICES}, got {self.device!r}")
        if not self.use_ray and self.n_workers != 1:
            raise ConfigError(
                f"trainer.use_ray=false runs one worker per group; got trainer.n_workers={self.n_workers}"
            )
        unknown = [x for x in self.logger if x not in LOGGERS]
        if unknown:
            raise ConfigError(f"trainer.logger has unknown sinks {unknown}; choose from {LOGGERS}")
        if self.resume not in ("auto", "disable") and not Path(self.resume).is_dir():
            raise ConfigError(
                f"trainer.resume={self.resume!r} is neither 'auto', 'disable' nor an existing global_step_N folder"
            )
        if self.cpus_per_worker <= 0 or self.worker_timeout_s <= 0 or self.max_ckpt_to_keep < 0:
            raise ConfigError("trainer.cpus_per_worker and worker_timeout_s must be > 0, max_ckpt_to_keep >= 0")
        self._check_mode()
        check_stop_on(self.stop_on, self.health)

    def _check_mode(self) -> None:
        if self.mode not in TRAINER_MODES:
            raise ConfigError(f"trainer.mode must be one of {TRAINER_MODES}, got {self.mode!r}")
        for key, value, low in (
            ("n_generators", self.n_generators, 1),
            ("max_staleness", self.max_staleness, 0),
            ("max_queue_batches", self.max_queue_batches, 1),
            ("max_generator_restarts", self.max_generator_restarts, 0),
        ):
            if value < low:
                raise ConfigError(f"trainer.{key} must be >= {low}, got {value}")
        if self.mode != "sync" and not self.use_ray:
            raise ConfigError(
                f"trainer.mode={self.mode} runs generator actors on Ray; set trainer.use_ray=true or trainer.mode=sync"
            )
        if self.mode == "one_step_off" and self.n_generators != 1:
            raise ConfigError(
                f"trainer.mode=one_step_off overlaps one batch with one generator; got trainer.n_generators="
                f"{self.n_generators} (use trainer.mode=async for several)"
            )


@dataclass(frozen=True)
class StepSettings:
    """The few facts about the run that the loop needs besides ``TrainerConfig`` and ``AlgorithmConfig``."""

    pad_token_id: int
    """Padding id of the tokenizer."""
    response_width: int
    """``rollout.max_response_tokens``: every batch's padded response width."""
    use_reference: bool
    """Compute reference log-probs (a KL term is on)."""
    greedy_baseline: bool
    """Roll out each prompt greedily as baseline (``remax``)."""
    reward: RewardConfig
    """Scoring per data source."""
    max_retriever_error_rate: float = 0.5
    """Stop the run when more than this share of a step's searches failed (``rollout.max_retriever_error_rate``)."""
    train_on_retriever_errors: bool = False
    """Keep trajectories with a failed search in the loss (``rollout.train_on_retriever_errors``)."""
    old_logprobs: str = "recompute"
    """``actor_rollout_ref.actor.old_logprobs``: ``auto``, ``recompute``, ``rollout`` or ``update``."""
    on_policy_update: bool = False
    """The actor takes one optimizer step per batch over one epoch (one mini-batch holds the whole batch)."""
    engine_matches_trainer: bool = False
    """The engine's log-probs are the trainer's up to float noise (HF engine, float32 compute)."""
    one_epoch_update: bool = False
    """The actor passes over each batch once (``actor.ppo_epochs=1``)."""
