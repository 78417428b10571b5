"""The model to train or evaluate, and its optimizer."""

from __future__ import annotations

from dataclasses import dataclass

from search_rl.config.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")


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
