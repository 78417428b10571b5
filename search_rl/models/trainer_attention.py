"""``model.attn_implementation``: the attention of the trainer's passes (actor, reference, critic).

``sdpa`` (the default) or transformers' ``eager``. Measured on the demo's policy in bf16 on an AVX512-BF16 EPYC
(2 threads; bench/README.md "Which attention the trainer runs"): eager took less time than SDPA in the demo's LoRA
GRPO update of one saved batch (every pair measured) but more in the full-weight warm start (``main_sft``, 4 of
every 4 paired steps) and in plain forward + backward passes of 700-token sequences, full or frozen weights, so SDPA
stays the default everywhere and eager is a switch to try on such an update. On CUDA SDPA's fused kernels need no
(B, H, L, L) score tensor.

The rollout engine keeps its own copy of the weights and its own attention (the HF engine's packed SDPA decode).
"""

from __future__ import annotations

import logging

from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

DEFAULT = "sdpa"


def use_trainer_attention(models: list[PreTrainedModel], name: str) -> str:
    """Set attention ``name`` on ``models`` (the policy, reference or critic backbone, never the engine's copy);
    returns it. A choice other than the default is logged."""
    for model in models:
        model.set_attn_implementation(name)
    if name != DEFAULT:
        logger.info("model.attn_implementation=%s in the trainer's passes (the rollout engine keeps its own)", name)
    return name
