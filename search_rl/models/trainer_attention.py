"""``model.attn_implementation``: the attention of the trainer's passes (actor, reference, critic) per device, dtype.

``auto`` picks transformers' ``eager`` attention on a CPU computing in bf16 and ``sdpa`` everywhere else:

- CPU, bf16: torch's CPU SDPA (a flash kernel) gains nothing from bf16 (5.1 s float32 against 5.7 s bf16 in one
  profiled demo update), while eager attention's score and value products are plain bf16 matmuls. The demo's GRPO
  update of one saved batch (``bench/update_dtype_profile.py --dtype bfloat16 --attn eager``, then ``--attn sdpa``;
  AVX512-BF16 EPYC, 2 threads) took 16.3 / 18.7 s and 16.0 / 21.5 s (eager / SDPA), earlier 15.5 / 17.5 and
  17.8 / 18.3 s.
- CPU, float32: the same pairs in float32 took 36.7 / 36.2 and 32.6 / 32.4 s: no gain, so SDPA stays.
- CUDA: SDPA's fused kernels (flash / memory-efficient) are faster than eager and need no (B, H, L, L) scores.

The rollout engine keeps its own copy of the weights and its own attention (the HF engine's packed SDPA decode).
"""

from __future__ import annotations

import logging

import torch
from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

AUTO = "auto"


def resolve_trainer_attention(requested: str, device: str | torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """(implementation, why) of the trainer's passes on ``device`` in ``dtype``; ``requested`` other than ``auto``
    is kept as is."""
    if requested != AUTO:
        return requested, f"model.attn_implementation={requested}"
    if torch.device(device).type == "cpu" and dtype == torch.bfloat16:
        return "eager", "bf16 on CPU: eager attention's bf16 matmuls measured faster than CPU SDPA in the RL update"
    return "sdpa", "SDPA's fused kernels (float32 on CPU measured the same with eager)"


def use_trainer_attention(
    models: list[PreTrainedModel], requested: str, device: str | torch.device, dtype: torch.dtype
) -> str:
    """Set the trainer's attention on ``models`` (the policy, reference or critic backbone, never the engine's copy),
    logging the choice when ``auto`` made it; returns the implementation."""
    name, why = resolve_trainer_attention(requested, device, dtype)
    for model in models:
        model.set_attn_implementation(name)
    if requested == AUTO:
        logger.info(
            "model.attn_implementation=auto -> %s on this process's %s (%s)", name, torch.device(device).type, why
        )
    return name
