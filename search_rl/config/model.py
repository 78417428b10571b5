"""The model to train or evaluate, and its optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from search_rl.config.loading import ConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""``model.dtype`` values: ``auto`` is resolved per machine (``search_rl.models.compute_dtype``)."""
ATTENTIONS = ("sdpa", "eager")
"""``model.attn_implementation`` values, as transformers names them (``models.trainer_attention``)."""


@dataclass
class ModelConfig:
    """The policy (and critic backbone) to start from."""

    path: str = "smollm2-135m-instruct"
    """``smollm2-135m-instruct`` (the packaged GGUF), ``tiny`` (a random 2-layer Llama built on the fly), a ``.gguf``
    file, or a local HF model directory such as a checkpoint's ``actor/`` folder. Nothing is downloaded."""
    dtype: str = "auto"
    """Compute dtype: forward/backward of the trained models, the reference and the rollout engine's weights.
    Trained weights and optimizer state stay fp32, and log-probs, entropies, losses and sampling float32, whatever it
    is. ``auto``: ``bfloat16`` on CUDA GPUs with native bf16 and on CPUs with AMX or AVX512-BF16 (measured faster:
    the demo's warm start 2.1x and GRPO step 1.46x on an AVX512-BF16 EPYC), ``float32`` on other CPUs (bf16 is
    emulated there: a matmul ~30x slower on an AVX2 machine); chosen per machine, logged, printed by ``diagnose`` and
    recorded in evaluation fingerprints (docs/training.md). ``float32`` or ``bfloat16`` force one; ``float16`` only for
    evaluation (training refuses it: no loss scaling)."""
    attn_implementation: str = "sdpa"
    """Attention of the trainer's passes (actor, reference and critic forward and backward): ``sdpa`` or ``eager``.
    On a CPU in bf16 eager made the demo's GRPO step 1.05x faster but its full-weight warm start 1.45x slower
    (bench/README.md), so SDPA is the default; the rollout engine keeps its own (``models.trainer_attention``)."""
    seed: int = 0
    """Initialisation seed of the ``tiny`` model."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about 30% more compute)."""
    lora_rank: int = 0
    """LoRA adapter rank (``peft``); 0 = full fine-tuning. With adapters the base stays frozen, the reference is the
    base with adapters disabled (no second copy), and checkpoints hold the adapters plus a merged model."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapted weight is ``W + lora_alpha / lora_rank * B @ A``."""
    lora_target_modules: str = "all-linear"
    """Layers that get adapters: ``all-linear`` (every linear layer except the output head) or comma-separated
    module names such as ``q_proj,k_proj,v_proj,o_proj``."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attn_implementation not in ATTENTIONS:
            raise ConfigError(
                f"model.attn_implementation must be one of {ATTENTIONS}, got {self.attn_implementation!r}"
            )
        # Why the compute dtype is what it is, filled by ``configure.resolve`` where it knows the device; recorded in
        # evaluation fingerprints. An attribute, not a field: it is not a setting.
        self.dtype_reason = ""
        if self.lora_rank < 0:
            raise ConfigError(f"model.lora_rank must be >= 0 (0 = full fine-tuning), got {self.lora_rank}")
        if self.lora_rank and self.lora_alpha <= 0:
            raise ConfigError(f"model.lora_alpha must be > 0, got {self.lora_alpha}")
        if self.lora_rank and not self.lora_target_modules.strip(" ,"):
            raise ConfigError("model.lora_target_modules is empty: name modules or use all-linear")


def check_trainable_dtype(model: ModelConfig) -> None:
    """Training computes in ``float32`` or ``bfloat16``.

    Raises:
        ConfigError: for ``float16``, whose small gradients underflow without loss scaling (not implemented).
    """
    if model.dtype == "float16":
        raise ConfigError(
            "model.dtype=float16 cannot train: fp16 gradients underflow without loss scaling, which search-rl does "
            "not do; use model.dtype=auto (bfloat16 where the machine computes it fast, else float32) or bfloat16"
        )


@dataclass
class OptimConfig:
    """AdamW with a linear warm-up to ``lr``, then constant or, with ``lr_decay_steps``, a cosine decay."""

    lr: float = 1e-6
    """Peak learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    lr_warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to ``lr``."""
    lr_decay_steps: int = 0
    """Optimizer steps of cosine decay after the warm-up, from ``lr`` to ``min_lr_ratio * lr`` (held there after);
    0 = constant ``lr``. A PPO run takes ``train_batch_size / ppo_mini_batch_size * ppo_epochs`` per training step."""
    min_lr_ratio: float = 0.0
    """Where the cosine decay ends, as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")
        for name in ("weight_decay", "lr_warmup_steps", "lr_decay_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"optim.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def lr_factor(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) as a fraction of ``lr``."""
        if step < self.lr_warmup_steps:
            return (step + 1) / self.lr_warmup_steps
        if self.lr_decay_steps == 0:
            return 1.0
        progress = min(1.0, (step - self.lr_warmup_steps) / self.lr_decay_steps)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
