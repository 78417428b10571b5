"""``model.attn_implementation``: the attention of the trainer's passes (actor, reference, critic).

``sdpa`` (the default) or transformers' ``eager``. Measured on the demo's policy in bf16 on an AVX512-BF16 EPYC
(2 threads; bench/README.md "Which attention the trainer runs"): the demo's warm start took 21.1 s/step with eager
against 14.6 s with SDPA and its GRPO step 30.2 against 31.6 s (``bench/dtype_speedup_bench.py --baseline eager``);
one forward + backward over whole 700-token sequences took 1.7x SDPA's time with eager, full or frozen weights, and
0.96-1.05x over responses reading a shared prompt (``bench/trainer_attention_bench.py``). So SDPA is the default
everywhere and eager a switch to try on a LoRA update over shared prompts. On CUDA SDPA's fused kernels need no
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
