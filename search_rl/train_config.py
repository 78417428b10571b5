"""Typed configuration of the trainer: the dataclasses behind ``configs/ppo_trainer.yaml``, registered in Hydra's
``ConfigStore`` so that an unknown key or a wrong type fails at compose time, and ``load_config`` for code and tests
that compose without ``@hydra.main``.

The rollout side (``RolloutConfig``, ``RetrieverClientConfig``, ``HFEngineConfig``) lives in ``search_rl.config``
and the RL objective (``AlgorithmConfig``) in ``search_rl.algorithms``; this module adds the groups around them and
``PPOConfig.validate``, the cross-field checks that run before Ray starts. Key names follow Search-R1/verl where
they exist (``do_search``, ``max_turns``, ``actor_rollout_ref.rollout.n``, ``trainer.total_training_steps``, ...).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from search_rl.algorithms import AlgorithmConfig, estimator_needs
from search_rl.config import HFEngineConfig, RetrieverClientConfig, RolloutConfig
from search_rl.reward.shaping import MAX_FORMAT_SCORE, PARTIAL_CREDITS, shaping_enabled

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The YAML configs (``ppo_trainer.yaml``, ``eval.yaml`` and their groups)."""

DEFAULT_GROUP_SIZE = 4
"""``rollout.n`` when it is left ``null`` and the estimator compares samples of a prompt."""

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
ENGINES = ("hf", "vllm")


class ConfigError(ValueError):
    """A configuration that cannot run; raised before Ray starts, with what is wrong and how to fix it."""


@dataclass
class ModelConfig:
    """The policy (and critic backbone) to start from."""

    path: str = "smollm2-135m-instruct"
    """``smollm2-135m-instruct`` (the packaged GGUF), ``tiny`` (a random 2-layer Llama built on the fly), a ``.gguf``
    file, or a local HF model directory such as a checkpoint's ``actor/`` folder. Nothing is downloaded."""
    dtype: str = "float32"
    """Compute dtype: forward/backward of the trained models, the reference and the rollout engine's weights.
    Trained weights and optimizer state stay fp32 whatever it is. ``float32`` (CPU: bf16 is slower there) or
    ``bfloat16`` (GPU); ``float16`` only for evaluation (training refuses it: no loss scaling)."""
    seed: int = 0
    """Initialisation seed of the ``tiny`` model."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about 30% more compute)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {DTYPES}, got {self.dtype!r}")


def check_trainable_dtype(model: ModelConfig) -> None:
    """Training computes in ``float32`` or ``bfloat16``.

    Raises:
        ConfigError: for ``float16``, whose small gradients underflow without loss scaling (not implemented).
    """
    if model.dtype == "float16":
        raise ConfigError(
            "model.dtype=float16 cannot train: fp16 gradients underflow without loss scaling, which search-rl does "
            "not do; use model.dtype=bfloat16 on GPUs (float32 on CPU)"
        )


@dataclass
class OptimConfig:
    """AdamW with a linear warm-up to a constant learning rate."""

    lr: float = 1e-6
    """Peak learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    lr_warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to ``lr``."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.weight_decay < 0 or self.lr_warmup_steps < 0:
            raise ConfigError(f"optim: lr must be > 0, weight_decay and lr_warmup_steps >= 0; got {self}")


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

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"actor_rollout_ref.actor.{name} must be >= 1, got {getattr(self, name)}")
        if self.grad_clip < 0:
            raise ConfigError(f"actor_rollout_ref.actor.grad_clip must be >= 0, got {self.grad_clip}")


@dataclass
class TrainRolloutConfig(RolloutConfig):
    """The rollout as the trainer runs it: the search loop's ``RolloutConfig`` plus samples per prompt and engine.

    ``do_search`` and ``max_turns`` are set from the top-level keys of the same names in the YAML.
    """

    n: int | None = None
    """Samples per prompt; ``null`` = 1, or 4 for estimators that compare samples of a prompt (``grpo``, ``rloo``)."""
    engine: str = "hf"
    """Generation backend: ``hf`` (transformers, CPU or GPU) or ``vllm`` (GPU, ``search-rl[vllm]``)."""
    hf: HFEngineConfig = field(default_factory=HFEngineConfig)
    """Settings of the ``hf`` engine."""
    gpu_memory_utilization: float = 0.4
    """``vllm`` engine: share of GPU memory it may take (the trainer shares the GPU)."""
    log_prob_micro_batch_size_per_gpu: int = 2
    """Samples per forward pass when the actor recomputes the sampling log-probs."""
    max_retriever_error_rate: float = 0.5
    """Circuit breaker for ``on_retriever_error=observe``: stop the run when more than this share of a training
    step's searches failed (1.0 = never)."""
    train_on_retriever_errors: bool = False
    """Keep trajectories that saw a retriever error in the loss; off: they are left out (scored, not trained on)
    and counted in ``rollout/left_out_retriever_errors``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.max_retriever_error_rate <= 1:
            rate = self.max_retriever_error_rate
            raise ConfigError(f"actor_rollout_ref.rollout.max_retriever_error_rate must be in [0, 1], got {rate}")
        if self.n is not None and self.n < 1:
            raise ConfigError(f"actor_rollout_ref.rollout.n must be >= 1, got {self.n}")
        if self.engine not in ENGINES:
            raise ConfigError(f"actor_rollout_ref.rollout.engine must be one of {ENGINES}, got {self.engine!r}")
        if self.log_prob_micro_batch_size_per_gpu < 1:
            raise ConfigError("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu must be >= 1")

    def search_loop_config(self) -> RolloutConfig:
        """The narrow ``RolloutConfig`` the generation manager takes (the trainer-only fields dropped)."""
        names = RolloutConfig.__dataclass_fields__
        return RolloutConfig(**{k: getattr(self, k) for k in names})


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


@dataclass
class DataConfig:
    """Parquet files of Search-R1 rows (``docs/data.md``)."""

    train_files: list[str] = field(default_factory=lambda: ["data/datasets/nq_hotpotqa_mini/train.parquet"])
    """Training parquet files (relative paths are taken from the working directory, then from the repository)."""
    val_files: list[str] = field(default_factory=lambda: ["data/datasets/nq_hotpotqa_mini/test.parquet"])
    """Validation parquet files; metrics are reported per ``data_source``."""
    train_batch_size: int = 4
    """Prompts per training step (each rolled out ``rollout.n`` times)."""
    val_max_samples: int | None = 32
    """Validate on a fixed, seeded subset of this many rows (``null`` = every row)."""
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
    """Which ``REWARDS`` entry scores each data source (``search_rl/reward/registry.py``), and the shaping applied on
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

    def __post_init__(self) -> None:
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

    def __post_init__(self) -> None:
        if self.total_training_steps < 1:
            raise ConfigError(f"trainer.total_training_steps must be >= 1, got {self.total_training_steps}")
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


@dataclass
class PPOConfig:
    """The root of ``configs/ppo_trainer.yaml``."""

    do_search: bool = True
    """Execute ``<search>`` actions against the retriever (Search-R1's key)."""
    max_turns: int = 4
    """Search turns per episode, then one final answer turn (Search-R1's key)."""
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
        rollout, needs = self.actor_rollout_ref.rollout, estimator_needs(self.algorithm.adv_estimator)
        if rollout.n is None:
            rollout.n = DEFAULT_GROUP_SIZE if needs.groups else 1
        if self.critic.enable is None:
            self.critic.enable = needs.critic

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
    def needs_greedy_baseline(self) -> bool:
        return estimator_needs(self.algorithm.adv_estimator).greedy_baseline

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
        algo, n = self.algorithm, self.n_samples
        needs = estimator_needs(algo.adv_estimator)
        if needs.groups and n < 2:
            raise ConfigError(
                f"algorithm.adv_estimator={algo.adv_estimator} compares the samples of each prompt, but "
                f"actor_rollout_ref.rollout.n={n}; set it to 2 or more (Search-R1 uses 5)"
            )
        if needs.critic and not self.use_critic:
            raise ConfigError(f"algorithm.adv_estimator={algo.adv_estimator} needs a critic; set critic.enable=true")
        if self.trainer.test_freq > 0 and not self.data.val_files:
            raise ConfigError("trainer.test_freq > 0 but data.val_files is empty; add files or set test_freq=0")

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


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (the YAMLs list them first in their defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="ppo_trainer_schema", node=PPOConfig)


def load_config(overrides: Sequence[str] = (), config_name: str = "ppo_trainer") -> Any:
    """Compose ``configs/<config_name>.yaml`` with command-line style overrides into its typed config
    (``PPOConfig`` for ``ppo_trainer``; ``main_eval.EvalConfig`` for ``eval``, registered by that module).

    Raises:
        hydra/omegaconf errors: an unknown key or a value of the wrong type.
        ConfigError / ValueError: a field out of range (from the dataclasses' ``__post_init__``).
    """
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        composed = compose(config_name=config_name, overrides=list(overrides))
    return to_config(composed)


def unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Dotted keys of ``node`` that ``schema`` (a dataclass) does not declare, recursively (keys added with Hydra's
    ``+`` are otherwise accepted silently). Dict-typed fields such as ``reward.by_data_source`` take any key."""
    if not dataclasses.is_dataclass(schema) or not isinstance(node, DictConfig):
        return []
    hints = typing.get_type_hints(schema)
    out: list[str] = []
    for key in node:
        name = str(key)
        if name not in hints:
            out.append(prefix + name)
        elif dataclasses.is_dataclass(hints[name]):
            out += unknown_keys(node._get_node(name), hints[name], f"{prefix}{name}.")
    return out


def to_config(composed: object) -> Any:
    """The dataclass tree of a composed ``DictConfig`` (interpolations resolved, ``__post_init__`` checks run).

    Raises:
        ConfigError: a key the schema does not have (a typo, or one added with ``+``).
    """
    if isinstance(composed, DictConfig):
        schema = OmegaConf.get_type(composed)
        unknown = unknown_keys(composed, schema) if isinstance(schema, type) else []
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; `--cfg job` prints every key (docs/configuration.md)")
    return OmegaConf.to_object(composed)  # type: ignore[arg-type]
