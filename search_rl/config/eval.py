"""``EvalConfig``, the root of ``configs/eval.yaml`` (evaluation, greedy or sampled, and its baselines)."""

from __future__ import annotations

from dataclasses import dataclass, field

from search_rl.config.loading import ConfigError
from search_rl.config.model import ModelConfig
from search_rl.config.rollout import DEFAULT_MAX_TURNS, EngineRolloutConfig, derive_search_turns
from search_rl.config.run import RewardConfig
from search_rl.config.search_backends import RetrieverClientConfig

BASELINES = ("search", "no_search", "naive_rag")
"""Valid ``baseline`` values."""


@dataclass
class EvalDataConfig:
    """What ``main_eval`` scores."""

    files: list[str] = field(default_factory=lambda: ["data/datasets/nq_hotpotqa_mini/test.parquet"])
    """Parquet files of Search-R1 rows."""
    max_samples: int | None = None
    """Score a fixed, seeded subset of this many rows (``null`` = every row)."""
    seed: int = 0
    """Seed of that subset."""


@dataclass
class EvalRolloutConfig(EngineRolloutConfig):
    """The search loop of evaluation (greedy unless ``n_samples > 1``) and its engine, under the same key paths as in
    training: ``actor_rollout_ref.rollout.*``, ``actor_rollout_ref.rollout.hf.*``, ``actor_rollout_ref.rollout.vllm.*``.
    """


@dataclass
class EvalActorRolloutRefConfig:
    """``actor_rollout_ref`` of evaluation: only its rollout."""

    rollout: EvalRolloutConfig = field(
        default_factory=lambda: EvalRolloutConfig(
            greedy=True, max_prompt_tokens=1536, prompt_truncation="left", gpu_memory_utilization=0.9
        )
    )
    """The search loop; greedy unless ``n_samples > 1`` (then its temperature, top-p, top-k and seed apply). Prompts
    may be longer than in training (``naive_rag`` inlines passages) and are cut from the left beyond that; vLLM may
    take 0.9 of the GPU (no trainer shares it here)."""


@dataclass
class EvalConfig:
    """The root of ``configs/eval.yaml``."""

    do_search: bool = True
    """Execute ``<search>`` actions (``search`` baseline only)."""
    max_turns: int = DEFAULT_MAX_TURNS
    """Search turns per episode (``search`` baseline only). With ``do_search`` it sets the rollout's
    ``search_turns``, the one value the rollout reads."""
    baseline: str = "search"
    """``search`` (the rows' prompts, with search), ``no_search`` (closed book) or ``naive_rag`` (top-k passages of
    the question inlined in the prompt, no search)."""
    rag_topk: int = 3
    """Passages inlined by ``naive_rag``."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model to evaluate: a base model or a checkpoint's ``actor/`` folder."""
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    """Rows to score."""
    actor_rollout_ref: EvalActorRolloutRefConfig = field(default_factory=EvalActorRolloutRefConfig)
    """The search loop (``actor_rollout_ref.rollout``) and its engine (``actor_rollout_ref.rollout.hf``)."""
    retriever: RetrieverClientConfig = field(default_factory=RetrieverClientConfig)
    """The retriever service (``search`` and ``naive_rag``)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring per data source."""
    batch_size: int = 32
    """Questions rolled out together (each with its ``n_samples`` samples)."""
    n_samples: int = 1
    """Answers per question: 1 = greedy decoding; ``k > 1`` = ``k`` samples at
    ``actor_rollout_ref.rollout.temperature``, reported as mean EM over the samples and pass@k."""
    output_dir: str = "runs/eval"
    """Where the run folder with ``metrics.json`` and ``trajectories.jsonl`` goes."""

    def __post_init__(self) -> None:
        self.actor_rollout_ref.rollout.search_turns = derive_search_turns(self.do_search, self.max_turns)
        if self.baseline not in BASELINES:
            raise ConfigError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.rag_topk < 1 or self.batch_size < 1:
            raise ConfigError("rag_topk and batch_size must be >= 1")
        if self.n_samples < 1:
            raise ConfigError(f"n_samples must be >= 1 (1 = greedy), got {self.n_samples}")
        if self.n_samples > 1 and self.actor_rollout_ref.rollout.temperature <= 0:
            raise ConfigError(
                f"n_samples={self.n_samples} samples at actor_rollout_ref.rollout.temperature, which must be > 0 "
                f"(got {self.actor_rollout_ref.rollout.temperature}); use n_samples=1 for greedy decoding"
            )

    @property
    def rollout(self) -> EvalRolloutConfig:
        """``actor_rollout_ref.rollout``."""
        return self.actor_rollout_ref.rollout
